"""The workers' Kafka transport: everything between a worker's step and the broker. Start here.

A worker (``workers/embed_worker.py``, ``rerank_worker.py``, ``vector_search.py``, ``cdc_bridge.py``) reads its
consumer groups through lanes and sends what is not a stored result through the outbox; the loop
(``workers/loop.py``) builds them after the start-up check (``embedstream/kafka_access.py``) and drives them.

- ``lane.py``: a lane, one consumer group's work from fetch to commit (bounded queue, offsets, pause/resume
  backpressure, rebalances, topics that appear late), and ``failure_kind``, what a failed write means.
- ``rd_consumer.py``: the lane's consumer, librdkafka (confluent-kafka) with KIP-848's consumer group protocol:
  every lane by default.
- ``kafka_io.py``: client construction and helpers every lane shares: the outbox's producer, group protocol
  settings, static members, commits of finished offsets, topic and broker probes; the kafka-python consumer,
  still a choice (``KafkaSettings.online_client`` / ``bulk_client`` = ``kafka-python``: cooperative-sticky).
- ``offsets.py``: which offsets may be committed (a contiguous run of finished records).
- ``outbox.py``: dead letters, request replies and requests handed on, through one producer.

Outside this package, on the same client: topics and admin (``producers/topics.py``), the CDC bridge's documents
memory (``workers/cdc_memory.py``), replay (``producers/replay.py``), the query client (``producers/query_client.py``).
"""
