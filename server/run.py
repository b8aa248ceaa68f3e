"""Running the app with uvicorn: serve() in the foreground (the CLI), BackgroundServer on a loopback
port in a thread (tests, benchmarks/load_bench).

Shutdown (Ctrl-C, SIGTERM, BackgroundServer.stop) is graceful: uvicorn stops accepting connections,
lets in-flight requests finish for `settings.shutdown_grace` seconds, then cancels what is left
(each cancelled stream stops its generation); last, the worker pool is shut down.
"""

from __future__ import annotations

import socket
import threading
import time

from jacobi_rt.runtime import BackendError, Generator, require

from .app import create_app
from .settings import SERVE_HINT, ServerSettings


def uvicorn_server(generator: Generator, settings: ServerSettings, host: str, port: int, log_level: str = "info"):
    """A uvicorn.Server for the app (not started)."""
    uvicorn = require("uvicorn", SERVE_HINT)
    config = uvicorn.Config(
        create_app(generator, settings),
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=settings.shutdown_grace,
        lifespan="on",
    )
    return uvicorn.Server(config)


def serve(
    generator: Generator, settings: ServerSettings, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info"
) -> None:
    """Serve until interrupted (SIGINT/SIGTERM), then shut down gracefully."""
    server = uvicorn_server(generator, settings, host, port, log_level)
    server.run()
    if not server.started:
        raise BackendError(
            f"the server could not start on {host}:{port} (is the port in use?); pick another with --port"
        )


class BackgroundServer:
    """The app on `host`:`port` (0: an ephemeral port) in a thread of this process.

    with BackgroundServer(generator, ServerSettings(model_id="m")) as server:
        httpx.get(server.url + "/health")
    """

    def __init__(
        self,
        generator: Generator,
        settings: ServerSettings,
        host: str = "127.0.0.1",
        port: int = 0,
        log_level: str = "warning",
    ):
        self.host = host
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.port = self._socket.getsockname()[1]
        self.server = uvicorn_server(generator, settings, host, self.port, log_level)
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._socket]}, name="jacobi-rt-server", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> BackgroundServer:
        self._thread.start()
        waited = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > waited:
                raise BackendError(f"the server did not start on {self.url} within {timeout:g} s")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 60.0) -> None:
        """Graceful shutdown (see the module's docstring); waits for the thread."""
        self.server.should_exit = True
        self._thread.join(timeout)

    @property
    def stopped(self) -> bool:
        return not self._thread.is_alive()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
