"""embedstream: streaming, Kafka-driven embeddings and reranking."""

from embedstream import _triton_guard

_triton_guard.install()
