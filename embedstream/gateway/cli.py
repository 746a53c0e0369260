"""``embedstream gateway``: the HTTP front door (typer command; registered on the main CLI)."""

from __future__ import annotations

import typer

from embedstream.gateway.config import GatewayOptions

_DEFAULTS = GatewayOptions()


def _help(name: str) -> str:
    return GatewayOptions.model_fields[name].description or ""


def gateway_cmd(
    host: str = typer.Option("127.0.0.1", help="Address to listen on (0.0.0.0 in a container)"),
    port: int = typer.Option(8080, help="HTTP port"),
    model: str = typer.Option(None, help="The embed workers' model (name or folder); default: EMBEDSTREAM_DEFAULT_MODEL"),
    rerank_model: str = typer.Option(None, help="The rerank workers' cross-encoder; without it /rerank answers 424"),
    max_inputs: int = typer.Option(_DEFAULTS.max_inputs, help="Texts per embed request; more is 413"),
    max_documents: int = typer.Option(_DEFAULTS.max_documents, help="Documents per rerank request; more is 413"),
    max_body_bytes: int = typer.Option(_DEFAULTS.max_body_bytes, help="Request body size; more is 413"),
    max_inflight: int = typer.Option(_DEFAULTS.max_inflight, help="Kafka requests awaiting replies; past it 429"),
    max_lag: int = typer.Option(_DEFAULTS.max_lag, help="Records the lane's worker group may be behind; past it 429"),
    timeout: float = typer.Option(_DEFAULTS.default_timeout_s, help="Deadline (s) when the client sends no timeout"),
    max_timeout: float = typer.Option(_DEFAULTS.max_timeout_s, help="Cap (s) on a client's timeout"),
    reply_topic: str = typer.Option(None, help="Reply topic of this gateway; default EMBEDSTREAM_KAFKA__TOPIC_REPLIES"),
    own_reply_topic: bool = typer.Option(_DEFAULTS.own_reply_topic, "--own-reply-topic/--shared-reply-topic",
                                         help=_help("own_reply_topic")),
    auto_truncate: bool = typer.Option(_DEFAULTS.auto_truncate, "--auto-truncate/--no-auto-truncate",
                                       help=_help("auto_truncate")),
    log_level: str = typer.Option("info", help="uvicorn log level"),
) -> None:
    """Serve OpenAI (/v1/embeddings), TEI (/embed, /rerank, /info), Cohere/Jina (/v2/embed, /v1|v2/rerank)
    and /search over the online Kafka lanes. Holds no model: the workers answer."""
    from embedstream import logs
    from embedstream.config import Settings
    from embedstream.gateway.server import serve

    settings = Settings()
    logs.configure(json=settings.log_json)
    options = GatewayOptions(model=model, rerank_model=rerank_model, max_inputs=max_inputs, max_documents=max_documents,
                             max_body_bytes=max_body_bytes, max_inflight=max_inflight, max_lag=max_lag,
                             default_timeout_s=timeout, max_timeout_s=max_timeout, reply_topic=reply_topic,
                             own_reply_topic=own_reply_topic,
                             auto_truncate=auto_truncate)
    serve(settings, options, host, port, log_level)


def main() -> None:
    typer.run(gateway_cmd)
