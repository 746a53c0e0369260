"""Client side of embedstream: chunk documents, publish them to Kafka, and ask for query embeddings."""

from embedstream.producers.chunker import Chunker
from embedstream.producers.sources import Document, DocumentSource, SourceError, iter_documents, parse_document

__all__ = [
    "Chunker",
    "ChunkPublisher",
    "Document",
    "DocumentSource",
    "PublishError",
    "QueryClient",
    "SourceError",
    "ensure_topics",
    "iter_documents",
    "parse_document",
]


def __getattr__(name: str) -> object:
    """Kafka-backed classes load lazily, so chunking and reading sources work without a Kafka client."""
    if name in ("ChunkPublisher", "PublishError"):
        from embedstream.producers import publisher

        return getattr(publisher, name)
    if name == "ensure_topics":
        from embedstream.producers.topics import ensure_topics

        return ensure_topics
    if name == "QueryClient":
        from embedstream.producers.query_client import QueryClient

        return QueryClient
    raise AttributeError(f"module 'producers' has no attribute {name!r}")
