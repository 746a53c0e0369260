"""The Starlette app: routes, error envelopes, total-time header, metrics, Kafka client lifecycle.

``create_app`` resolves the model specs at once (no weights: names, sizes, limits for checks and
``/info``) and connects to Kafka in the lifespan (a ``QueryClient`` with one reply reader, the lag
probes). Without a lifespan (httpx's ASGI transport) the routes still answer every check that needs
no worker, and 503 for the rest.
"""

from __future__ import annotations

import contextlib
import time
from typing import Awaitable, Callable

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from embedstream import logs
from embedstream.config import Settings
from embedstream.engine.errors import EngineError
from embedstream.engine.model_spec import resolve_model
from embedstream.gateway import routes_embed, routes_rank, routes_tei
from embedstream.gateway.config import GatewayOptions
from embedstream.gateway.errors import ApiError, Dialect
from embedstream.gateway.lanes import KafkaLanes
from embedstream.gateway.metrics import GatewayMetrics
from embedstream.gateway.overload import Admission, LagMonitor
from embedstream.gateway.service import Gateway

log = logs.get("embedstream.gateway")



def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("embedstream")
    except PackageNotFoundError:
        return "unknown"


VERSION = _version()


def connect(settings: Settings, options: GatewayOptions) -> tuple[KafkaLanes, LagMonitor]:
    """The Kafka side: request topics present, one reply reader, the lag probes (blocking; run off the loop)."""
    from embedstream.producers.topics import ensure_topics
    from embedstream.producers.query_client import QueryClient

    from embedstream.producers.search_routing import search_topic

    k = settings.kafka
    topics = [k.topic_queries, k.topic_rerank, search_topic(k, settings.qdrant.collection)]
    ensure_topics(k, topics=topics)
    client = QueryClient(k.model_copy(update={"fetch_max_wait_ms": options.reply_fetch_wait_ms}), options.reply_topic)
    try:
        client.prepare(topics)
    except BaseException:
        client.close()
        raise
    monitor = LagMonitor(k, options.lag_interval_s, settings.qdrant.collection).start()
    admission = Admission(options.max_inflight, options.max_lag, options.retry_after_s, monitor)
    return KafkaLanes(client, admission), monitor


def create_app(settings: Settings | None = None, options: GatewayOptions | None = None) -> Starlette:
    settings = settings or Settings()
    options = options or GatewayOptions()
    spec = resolve_model(options.model or settings.default_model, settings.models)
    rerank_spec, rerank_problem = None, "this gateway has no reranker configured (--rerank-model)"
    if options.rerank_model:
        try:
            rerank_spec = resolve_model(options.rerank_model, settings.models)
        except EngineError as err:  # embeddings keep working; rerank routes answer 424 with the reason
            rerank_problem = f"the reranker {options.rerank_model!r} cannot be used: {err.message}"
            log.warning("reranker unavailable", model=options.rerank_model, error=err.message)
    gateway = Gateway(settings, options, spec, rerank_spec, rerank_problem=rerank_problem)
    metrics = GatewayMetrics()

    def endpoint(route: str, dialect: Dialect, handler: Callable[..., Awaitable[Response]], boxed: bool = False):
        """Errors as the dialect's envelope, ``x-total-time`` on every answer, one metrics sample."""
        async def run(request: Request) -> Response:
            start = time.perf_counter()
            box = [dialect]
            try:
                response = await (handler(gateway, request, box) if boxed else handler(gateway, request))
            except ApiError as err:
                response = JSONResponse(err.body(box[0]), err.status, headers=err.headers())  # type: ignore[arg-type]
            except Exception as exc:  # noqa: BLE001 - one bad request must not take the server down
                log.exception("gateway request failed", route=route)
                err = ApiError(500, "internal_error", f"internal error: {type(exc).__name__}")
                response = JSONResponse(err.body(box[0]), 500)  # type: ignore[arg-type]
            elapsed = time.perf_counter() - start
            response.headers["x-total-time"] = f"{elapsed * 1000:.3f}"
            metrics.observe(route, response.status_code, elapsed)
            return response

        return run

    async def health(request: Request) -> Response:
        """Ready: the Kafka client is up (also /readyz, the orchestrator's readiness probe)."""
        ok = gateway.lanes is not None and gateway.lanes.healthy()
        return JSONResponse({"status": "ok" if ok else "unavailable"}, 200 if ok else 503)

    async def alive(request: Request) -> Response:
        """Liveness (/healthz): the event loop answers. A broker outage is readiness, not a reason to restart."""
        return JSONResponse({"alive": True})

    async def info(request: Request) -> Response:
        return JSONResponse(gateway.info(VERSION))

    async def metrics_route(request: Request) -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        lanes, monitor = await anyio.to_thread.run_sync(connect, settings, options)
        gateway.lanes = lanes
        metrics.watch(lanes.admission)
        log.info("gateway ready", model=spec.name, reranker=rerank_spec.name if rerank_spec else None,
                 queries=settings.kafka.topic_queries, replies=lanes.reply_topic)
        try:
            yield
        finally:
            gateway.lanes = None
            await anyio.to_thread.run_sync(lanes.close)
            await anyio.to_thread.run_sync(monitor.close)

    embed_openai = endpoint("openai_embeddings", "openai", routes_embed.openai_embeddings)
    routes = [
        Route("/v1/embeddings", embed_openai, methods=["POST"]),
        Route("/embeddings", embed_openai, methods=["POST"]),
        Route("/embed", endpoint("embed", "tei", routes_embed.tei_embed), methods=["POST"]),
        Route("/embed_sparse", endpoint("embed_sparse", "tei", routes_embed.tei_embed_sparse), methods=["POST"]),
        Route("/v2/embed", endpoint("cohere_embed", "cohere", routes_embed.cohere_embed), methods=["POST"]),
        Route("/rerank", endpoint("rerank", "tei", routes_rank.rerank, boxed=True), methods=["POST"]),
        Route("/v1/rerank", endpoint("cohere_rerank", "cohere", routes_rank.cohere_rerank), methods=["POST"]),
        Route("/v2/rerank", endpoint("cohere_rerank", "cohere", routes_rank.cohere_rerank), methods=["POST"]),
        Route("/search", endpoint("search", "tei", routes_rank.search), methods=["POST"]),
        # TEI's root route (by the body: embed or rerank), SageMaker's name for it, and what TEI clients call first
        Route("/", endpoint("tei_root", "tei", routes_tei.root, boxed=True), methods=["POST"]),
        Route("/invocations", endpoint("tei_root", "tei", routes_tei.root, boxed=True), methods=["POST"]),
        Route("/predict", endpoint("predict", "tei", routes_tei.predict), methods=["POST"]),
        Route("/tokenize", endpoint("tokenize", "tei", routes_tei.tokenize), methods=["POST"]),
        Route("/decode", endpoint("decode", "tei", routes_tei.decode), methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/readyz", health, methods=["GET"]),
        Route("/healthz", alive, methods=["GET"]),
        Route("/info", info, methods=["GET"]),
        Route("/metrics", metrics_route, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.gateway = gateway
    return app
