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
    load = load or LoadOptions()
    read_meta(index_dir)  # a missing or corrupt index fails here, before anything binds
    state = ServerState(limits)
    failure: list[str] = []

    def stop(reason: str) -> None:
        failure.append(reason)
        server.should_exit = True

    def start_process() -> SearchProcess:
        return SearchProcess(index_dir, load, warm_up_depth=limits.topk_max)

    pool = SearchPool(start_process, search_processes, crash_window_s=crash_window_s, on_fatal=stop)
    loading: list[asyncio.Task] = []

    def stop_searching() -> None:
        """Idempotent: the load cancelled, queries in flight failed, every search process killed."""
        for task in loading:
            task.cancel()
        if state.engine is not None:
            state.engine.close()
        pool.close()

    async def load_index() -> None:
        try:
            await pool.start()
            state.store = CorpusStore(Path(index_dir) / "corpus")  # memory-mapped: pages shared with the searchers'
        except Exception as exc:  # reported when the server has stopped
            pool.close()
            stop(str(exc))
            return
        state.index = pool.description
        state.engine = SearchEngine(
            pool, depth=limits.topk_max, max_batch=max_batch, max_wait_ms=max_wait_ms, cache_size=cache_size
        )
        # one write: print() writes the newline apart, and a log line from another thread can land between
        print(f"retriever_server: ready ({state.index})\n", end="", file=sys.stderr, flush=True)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        loading.append(asyncio.get_running_loop().create_task(load_index()))
        try:
            yield
        finally:
            stop_searching()

    app = create_app(state, lifespan)
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
    server = _Server(config, on_shutdown=stop_searching)
    if port_file is not None:
        Path(port_file).write_text(str(bound_port))
    print(f"retriever_server: listening on http://{host}:{bound_port}", file=sys.stderr, flush=True)
    server.run(sockets=[sock])
    if failure:
        print(f"retriever_server: cannot serve {index_dir}: {failure[0]}", file=sys.stderr, flush=True)
        return 1
    return 0


class _Server(uvicorn.Server):
    """uvicorn's server, which stops searching as its shutdown begins rather than after it has
    waited for open connections (a search in flight would hold the stop for its whole length)."""

    def __init__(self, config: uvicorn.Config, *, on_shutdown: Callable[[], None]):
        super().__init__(config)
        self._on_shutdown = on_shutdown

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._on_shutdown()
        await super().shutdown(sockets)
