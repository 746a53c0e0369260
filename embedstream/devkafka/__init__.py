"""Local development Apache Kafka: one KRaft node (broker + controller), or a cluster of N such nodes.

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
* ``broker``: start / stop / restart / status of one node
* ``cluster``: one node or a cluster of N (``brokers=3``): start / stop / restart / status; ``borrowed``
  (started here: stopped on the way out); a node killed, stopped, started (the cluster's fault tests)
* ``cli``: ``python -m embedstream.devkafka start|stop|restart|status|jars [--port N] [--brokers N]``
"""

from embedstream.devkafka.broker import BrokerInfo
from embedstream.devkafka.cluster import (ClusterInfo, borrowed, cluster_size, kill_node, restart, start, start_node,
                                          status, stop, stop_node)
from embedstream.devkafka.cli import main
from embedstream.devkafka.errors import DevKafkaError
from embedstream.devkafka.jars import ensure_jars, kafka_version
from embedstream.devkafka.layout import default_data_dir
from embedstream.devkafka.probe import broker_answers
from embedstream.devkafka.process import port_free


__all__ = [
    "BrokerInfo",
    "ClusterInfo",
    "borrowed",
    "cluster_size",
    "kill_node",
    "start_node",
    "stop_node",
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
