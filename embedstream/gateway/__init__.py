"""The HTTP front door: OpenAI, TEI and Cohere/Jina shaped requests onto the online Kafka lanes.

The gateway holds no model. Each input becomes a ``QueryRequest`` (or one ``RerankRequest`` /
``SearchRequest``) on the online topics; one shared reply consumer (``QueryClient``) hands the
replies back by correlation id. ``create_app`` builds the Starlette app; ``embedstream gateway``
serves it with uvicorn.
"""

from embedstream.gateway.app import create_app
from embedstream.gateway.config import GatewayOptions

__all__ = ["GatewayOptions", "create_app"]
