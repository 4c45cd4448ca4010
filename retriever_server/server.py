"""Running the API: bind the socket first (so `--port 0` works and the address is printed), then load
the index in its search processes (`pool.py`) while /health answers "loading". Exit non-zero if
loading fails, a restart fails, or a search process is in a crash loop.

A stop (SIGINT or SIGTERM, to this process or its whole group, while loading or serving) kills the
search processes as uvicorn's shutdown begins, before it waits for open connections: a search in
flight fails with a 500 that says the server is stopping, and nothing is restarted. SIGTERM ends
the process by that signal, as uvicorn does, and so does SIGINT, without a traceback (`__main__`)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from retriever_server.app import ServerState, create_app
from retriever_server.corpus import CorpusStore
from retriever_server.engine import SearchEngine
from retriever_server.index import read_meta
from retriever_server.options import LoadOptions, ServerLimits
from retriever_server.pool import SearchPool
from retriever_server.protocol import protocol_class
from retriever_server.search_process import SearchProcess


def serve(
    index_dir: Path,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    limits: ServerLimits | None = None,
    load: LoadOptions | None = None,
    max_batch: int = 256,
    max_wait_ms: float = 0.0,
    cache_size: int = 100_000,
    port_file: Path | None = None,
    log_level: str = "warning",
    search_processes: int = 1,
    crash_window_s: float = 10.0,
) -> int:
    """Serve `index_dir` until interrupted; returns the process exit code."""
    limits = limits or ServerLimits()
    read_meta(index_dir)  # a missing or corrupt index fails here, before anything binds
    state = ServerState(limits)
    engine_options = {"max_batch": max_batch, "max_wait_ms": max_wait_ms, "cache_size": cache_size}
    lifecycle = _Lifecycle(index_dir, state, load or LoadOptions(), search_processes, crash_window_s, engine_options)
    app = create_app(state, lifecycle.lifespan)
    # proto IPPROTO_TCP: asyncio sets TCP_NODELAY only on sockets that say so (else +40 ms per response)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound_port = sock.getsockname()[1]
    http = protocol_class(limits, state.connections)
    config = uvicorn.Config(
        app,
        http=http,
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=5,
        timeout_keep_alive=limits.keep_alive_s,
    )
    lifecycle.server = _Server(config, on_shutdown=lifecycle.close)
    if port_file is not None:
        Path(port_file).write_text(str(bound_port))
    print(f"retriever_server: listening on http://{host}:{bound_port}", file=sys.stderr, flush=True)
    lifecycle.server.run(sockets=[sock])
    if lifecycle.failure:
        print(f"retriever_server: cannot serve {index_dir}: {lifecycle.failure}", file=sys.stderr, flush=True)
        return 1
    return 0


class _Lifecycle:
    """The index's life in one server: loaded in its search processes once uvicorn serves (`lifespan`),
    stopped with a reason when loading fails or the pool gives up (`stop`), and closed as uvicorn's
    shutdown begins (`close`)."""

    def __init__(
        self,
        index_dir: Path,
        state: ServerState,
        load: LoadOptions,
        search_processes: int,
        crash_window_s: float,
        engine_options: dict,
    ):
        self.index_dir, self.state, self.load_options, self.engine_options = index_dir, state, load, engine_options
        self.pool = SearchPool(self._start_process, search_processes, crash_window_s=crash_window_s, on_fatal=self.stop)
        self.server: uvicorn.Server | None = None  # set before it runs: `stop` ends it
        self.failure = ""  # the first reason the server stopped for, if any
        self._loading: asyncio.Task | None = None

    def _start_process(self) -> SearchProcess:
        return SearchProcess(self.index_dir, self.load_options, warm_up_depth=self.state.limits.topk_max)

    def stop(self, reason: str) -> None:
        """End the server with `reason` (the exit code is then 1)."""
        self.failure = self.failure or reason
        self.server.should_exit = True

    async def load(self) -> None:
        """Start the search processes and open the corpus; then the engine serves and /health says ready."""
        state = self.state
        try:
            await self.pool.start()
            # memory-mapped: its pages are shared with the search processes'
            state.store = CorpusStore(Path(self.index_dir) / "corpus")
        except Exception as exc:  # reported when the server has stopped
            self.pool.close()
            self.stop(str(exc))
            return
        state.index = self.pool.description
        state.engine = SearchEngine(self.pool, depth=state.limits.topk_max, **self.engine_options)
        # one write: print() writes the newline apart, and a log line from another thread can land between
        print(f"retriever_server: ready ({state.index})\n", end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Idempotent: the load cancelled, queries in flight failed, every search process killed."""
        if self._loading is not None:
            self._loading.cancel()
        if self.state.engine is not None:
            self.state.engine.close()
        self.pool.close()

    @contextlib.asynccontextmanager
    async def lifespan(self, app: FastAPI):
        self._loading = asyncio.get_running_loop().create_task(self.load())
        try:
            yield
        finally:
            self.close()


class _Server(uvicorn.Server):
    """uvicorn's server, which stops searching as its shutdown begins rather than after it has
    waited for open connections (a search in flight would hold the stop for its whole length)."""

    def __init__(self, config: uvicorn.Config, *, on_shutdown: Callable[[], None]):
        super().__init__(config)
        self._on_shutdown = on_shutdown

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._on_shutdown()
        await super().shutdown(sockets)
