"""Local development Apache Kafka broker: one KRaft node (broker + controller).

No Docker here, so the broker is the real Apache Kafka from its official jars on
Maven Central (listed in ``compose/kafka-dev/pom.xml``), fetched once by ``mvn``
into a per-version cache and run as a detached ``java kafka.Kafka`` process.

One module per job:

* ``jars``: the broker's jars (pom → Maven Central → per-version cache)
* ``jvm``: the Java 17+ runtime, JVM flags, the class-data sharing archive
* ``layout``: the data dir's files (see there for the layout)
* ``storage``: server.properties, log4j2.properties, formatting the KRaft storage once
* ``process``: launching (``spawn``: every dev service), finding and stopping the broker process
* ``leash``: what a test run or a command that borrowed a broker starts dies with it, even killed -9
* ``probe``: readiness over the wire (raw ApiVersions + Metadata; stdlib only)
* ``broker``: start / stop / restart / status; ``borrowed`` (started here: stopped on the way out)
* ``cli``: ``python -m embedstream.devkafka start|stop|restart|status|jars [--port N]``
"""

from embedstream.devkafka.broker import BrokerInfo, borrowed, restart, start, status, stop
from embedstream.devkafka.cli import main
from embedstream.devkafka.errors import DevKafkaError
from embedstream.devkafka.jars import ensure_jars, kafka_version
from embedstream.devkafka.layout import default_data_dir
from embedstream.devkafka.probe import broker_answers
from embedstream.devkafka.process import port_free


__all__ = [
    "BrokerInfo",
    "borrowed",
    "DevKafkaError",
    "broker_answers",
    "default_data_dir",
    "ensure_jars",
    "kafka_version",
    "main",
    "port_free",
    "restart",
    "start",
    "status",
    "stop",
]
