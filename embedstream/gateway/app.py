"""The Starlette app: routes, error envelopes, total-time header, metrics, Kafka client lifecycle.

``create_app`` resolves the model specs at once (no weights: names, sizes, limits for checks and
``/info``) and connects to Kafka in the lifespan (a ``QueryClient`` with one reply reader, the lag
probes). Without a lifespan (httpx's ASGI transport) the routes still answer every check that needs
no worker, and 503 for the rest.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import socket
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
from embedstream.gateway.openapi import VERSION, openapi_document
from embedstream.gateway.operations import OPERATIONS
from embedstream.gateway.overload import Admission, LagMonitor
from embedstream.gateway.service import Gateway

log = logs.get("embedstream.gateway")


def _by_method(handlers: dict[str, Callable[[Request], Awaitable[Response]]]) -> Callable[[Request], Awaitable[Response]]:
    """One endpoint for a path's methods (GET / is health, POST / TEI's root route); HEAD is GET's."""
    if len(handlers) == 1:
        return next(iter(handlers.values()))

    async def dispatch(request: Request) -> Response:
        return await handlers[request.method if request.method != "HEAD" else "GET"](request)

    return dispatch


_CLIENTS = itertools.count()


def own_name() -> str:
    """This gateway's name in its own reply topic: host (a pod's name), process id and the how-manyth gateway of the
    process (tests run several; one closing must not delete another's topic), as topic names allow. ``/info`` says
    the topic."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", f"{socket.gethostname()}-{os.getpid()}-{next(_CLIENTS)}")[:120]


def connect(settings: Settings, options: GatewayOptions) -> tuple[KafkaLanes, LagMonitor]:
    """The Kafka side: request topics present, one reply reader, the lag probes (blocking; run off the loop)."""
    from embedstream.producers.topics import TopicsError, ensure_topics
    from embedstream.producers.query_client import QueryClient
    from embedstream.producers.search_routing import search_topic

    k = settings.kafka
    topics = [k.topic_queries, k.topic_rerank, search_topic(k, settings.qdrant.collection)]
    ensure_topics(k, topics=topics)
    reading = k.model_copy(update={"fetch_max_wait_ms": options.reply_fetch_wait_ms})
    try:
        client = QueryClient(reading, options.reply_topic, own_reply_topic=own_name() if options.own_reply_topic else None)
    except TopicsError as exc:  # no right to create it (a prefixed Create ACL is missing): the shared one, said
        log.warning("cannot make this gateway's own reply topic; reading the shared one", error=str(exc)[:300])
        client = QueryClient(reading, options.reply_topic)
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
                response = JSONResponse(err.body(box[0]), err.status_for(box[0]), headers=err.headers())  # type: ignore[arg-type]
            except Exception as exc:  # noqa: BLE001 - one bad request must not take the server down
                log.exception("gateway request failed", route=route)
                err = ApiError(500, "internal_error", f"internal error: {type(exc).__name__}")
                response = JSONResponse(err.body(box[0]), 500)  # type: ignore[arg-type]
            elapsed = time.perf_counter() - start
            response.headers["x-total-time"] = f"{elapsed * 1000:.3f}"
            metrics.observe(route, response.status_code, elapsed)
            return response

        return run

    async def health(gateway: Gateway, request: Request) -> Response:
        if gateway.lanes is None or not gateway.lanes.healthy():
            raise ApiError(503, "kafka_unavailable", "unhealthy: the gateway has no working Kafka client")
        return JSONResponse({"status": "ok"})

    async def alive(gateway: Gateway, request: Request) -> Response:
        """Liveness (/healthz): the event loop answers. A broker outage is readiness (/readyz), not a reason to restart."""
        return JSONResponse({"alive": True})

    async def info(gateway: Gateway, request: Request) -> Response:
        return JSONResponse(gateway.info(VERSION))

    async def metrics_route(gateway: Gateway, request: Request) -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    async def openapi(gateway: Gateway, request: Request) -> Response:
        return JSONResponse(openapi_document())

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

    handlers: dict[str, Callable[..., Awaitable[Response]]] = {
        "embed": routes_embed.tei_embed, "embed_all": routes_embed.tei_embed_all,
        "embed_sparse": routes_embed.tei_embed_sparse, "similarity": routes_embed.tei_similarity,
        "openai_embeddings": routes_embed.openai_embeddings, "cohere_embed": routes_embed.cohere_embed,
        "rerank": routes_rank.rerank, "cohere_rerank": routes_rank.cohere_rerank, "search": routes_rank.search,
        "tei_root": routes_tei.root, "predict": routes_tei.predict, "tokenize": routes_tei.tokenize,
        "decode": routes_tei.decode, "health": health, "alive": alive, "info": info, "metrics": metrics_route, "openapi": openapi,
    }
    boxed = {"rerank", "tei_root"}  # the body decides the dialect of their errors
    # The route table decides what is served (and documented: openapi.py reads the same table)
    by_path: dict[str, dict[str, Callable]] = {}
    for op in OPERATIONS:
        by_path.setdefault(op.path, {})[op.method] = endpoint(op.name, op.dialect, handlers[op.name], op.name in boxed)
    routes = [Route(path, _by_method(methods), methods=list(methods)) for path, methods in by_path.items()]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.gateway = gateway
    return app
