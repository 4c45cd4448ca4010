"""Running the API: bind the socket first (so `--port 0` works and the address is printed), load the
index (in its search processes, `search_process.py`) while /health answers "loading"; exit non-zero if
loading fails or a search process dies."""

from __future__ import annotations

import socket
import sys
import threading
from pathlib import Path

import uvicorn

from retriever_server.app import ServerLimits, create_app
from retriever_server.corpus import CorpusStore
from retriever_server.engine import SearchEngine
from retriever_server.index import read_meta
from retriever_server.options import LoadOptions
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
) -> int:
    """Serve `index_dir` until interrupted; returns the process exit code."""
    limits = limits or ServerLimits()
    read_meta(index_dir)  # a missing or corrupt index fails here, before anything binds
    app = create_app(limits)
    # proto IPPROTO_TCP: asyncio sets TCP_NODELAY only on sockets that say so (else +40 ms per response)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound_port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level=log_level, access_log=False, timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    failure: list[BaseException] = []

    def stop(error: BaseException) -> None:
        failure.append(error)
        server.should_exit = True

    searchers: list[SearchProcess] = []

    def load_index() -> None:
        try:
            for _ in range(search_processes):  # one after another: later ones find inductor's cache warm
                searchers.append(
                    SearchProcess(
                        index_dir,
                        load or LoadOptions(),
                        warm_up_depth=limits.topk_max,
                        on_exit=lambda reason: stop(RuntimeError(reason)),
                    )
                )
            app.state.store = CorpusStore(Path(index_dir) / "corpus")  # memory-mapped: pages shared with the searchers'
            app.state.index = searchers[0].description
            app.state.engine = SearchEngine(
                searchers, depth=limits.topk_max, max_batch=max_batch, max_wait_ms=max_wait_ms, cache_size=cache_size
            )
            # one write: print() writes the newline apart, and a log line from another thread can land between
            print(f"retriever_server: ready ({app.state.index})\n", end="", file=sys.stderr, flush=True)
        except BaseException as exc:  # reported below, after the server has stopped
            stop(exc)

    threading.Thread(target=load_index, name="load-index", daemon=True).start()
    if port_file is not None:
        Path(port_file).write_text(str(bound_port))
    print(f"retriever_server: listening on http://{host}:{bound_port}", file=sys.stderr, flush=True)
    server.run(sockets=[sock])
    if app.state.engine is not None:
        app.state.engine.close()
    for searcher in searchers:
        searcher.close()
    if failure:
        print(f"retriever_server: cannot serve {index_dir}: {failure[0]}", file=sys.stderr, flush=True)
        return 1
    return 0
