"""Qdrant endpoints that fail as a server or a cluster does, for the real qdrant-client to meet (no Qdrant binary here).

Each listens on loopback, on a port derived from ``EMBEDSTREAM_TEST_KAFKA_PORT`` (``ports.FAILING_ENDPOINTS`` and up:
tests/ports.py), so parallel suites on one host keep apart:

* :func:`closed_port`: nothing listens (a node down: connection refused);
* :class:`SilentEndpoint`: accepts and never answers (a node hung, a partition: the client's timeout), or
  hangs up on every request (a node dying mid-answer);
* :class:`ErrorEndpoint`: answers every REST call with a status and Qdrant's error body
  (``{"status": {"error": ...}, "time": ...}``, as ``src/actix/helpers.rs`` writes it);
* :class:`GrpcErrorEndpoint`: answers every gRPC call with a status code and Qdrant's message.
"""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import ports


def endpoint_port(offset: int) -> int:
    """The test port ``offset`` (0-99) above the suite's fault-endpoint base."""
    return ports.port(ports.FAILING_ENDPOINTS + offset)


def closed_port(offset: int) -> int:
    """A test port nothing listens on (checked)."""
    port = endpoint_port(offset)
    with socket.socket() as probe:
        probe.settimeout(1)
        assert probe.connect_ex(("127.0.0.1", port)) != 0, f"port {port} is in use"
    return port


class ErrorEndpoint:
    """Every REST call answered ``status`` with Qdrant's error body; ``answer`` changes both; ``calls`` counts."""

    def __init__(self, offset: int, status: int = 503, message: str = "Shard temporarily unavailable: test",
                 headers: dict[str, str] | None = None):
        self.port = endpoint_port(offset)
        self.calls = 0
        self.answer(status, message, headers)
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def _fail(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                if length:
                    self.rfile.read(length)
                owner.calls += 1
                status, body, extra = owner._answer
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                for key, value in extra.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_PUT = do_POST = do_DELETE = do_PATCH = _fail

            def log_message(self, *args) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def answer(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        body = json.dumps({"status": {"error": message}, "time": 0.000012}).encode()
        self._answer = (status, body, headers or {})

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ErrorEndpoint:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


class SilentEndpoint:
    """Accepts connections and never answers, until closed; ``hang_up``: closes each one at once instead."""

    def __init__(self, offset: int, hang_up: bool = False):
        self.port = endpoint_port(offset)
        self.hang_up = hang_up
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", self.port))
        self.listener.listen(16)
        self.connections: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            if self.hang_up:
                conn.recv(65536)
                conn.close()
            else:
                self.connections.append(conn)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> SilentEndpoint:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        for conn in self.connections:
            conn.close()
        self.thread.join(10)


class GrpcErrorEndpoint:
    """Every gRPC call (any service, any method) aborted with ``code`` and ``message``."""

    def __init__(self, offset: int, code, message: str):
        import grpc
        from concurrent.futures import ThreadPoolExecutor

        self.port = endpoint_port(offset)
        self.code, self.message = code, message
        owner = self

        def behaviour(_request, context):
            context.abort(owner.code, owner.message)

        class AnyMethod(grpc.GenericRpcHandler):
            def service(self, _details):
                return grpc.unary_unary_rpc_method_handler(behaviour)

        self.server = grpc.server(ThreadPoolExecutor(max_workers=2), handlers=[AnyMethod()])
        assert self.server.add_insecure_port(f"127.0.0.1:{self.port}") == self.port

    def __enter__(self) -> GrpcErrorEndpoint:
        self.server.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.stop(grace=None).wait(10)
