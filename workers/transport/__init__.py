"""The workers' Kafka transport: everything between a worker's step and the broker.

A worker (``workers/embed_worker.py``, ``workers/rerank_worker.py``, ``workers/cdc_bridge.py``) reads its
consumer groups through lanes and sends what is not a stored result through the outbox; the loop
(``workers/loop.py``) drives them. What lives where:

- ``lane.py``: a lane, one consumer group's work from fetch to commit (consumer, bounded queue,
  offsets, pause/resume backpressure, rebalance handling, topics that appear late), and
  ``failure_kind``, what a failed write means for its records.
- ``rd_consumer.py``: the lane's consumer over librdkafka (confluent-kafka).
- ``kafka_io.py``: client construction and the helpers every lane shares (the kafka-python consumer,
  the producer, rebalancing settings per group protocol, commits of finished offsets, probes).
- ``offsets.py``: which offsets may be committed (a contiguous run of finished records).
- ``outbox.py``: dead letters, request replies and requests handed on, through one producer.
"""
