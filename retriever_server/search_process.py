"""The searcher (query encoder + index) in a process of its own.

In the server's process the encoder would share Python's GIL with the HTTP event loop: each time it
returns to Python (tokenizer, padding, pooling, faiss, result arrays) it waits for the loop to yield
the GIL, up to the 5 ms switch interval at a time. In a child process each has an interpreter of its
own and the operating system runs them on separate cores. The server's search thread sends a query
batch down a pipe and waits for the (rows, scores) answer without holding the GIL. Cache,
de-duplication and coalescing stay in the server (engine.py).
Each child runs `LoadOptions.threads` threads in every library it loads (by default
`options.default_threads`), so that the processes do not fight over the cores; a dense child runs a
batch that is the server's only work on the idle cores too, up to `LoadOptions.lone_threads`
(`lone_threads.py`).

A stop is the server's to make: the child ignores SIGINT and SIGTERM from its first instruction
(they are blocked in the thread that spawns it, and it sets them ignored before unblocking), so a
Ctrl-C or a `kill` of the process group reaches only the server, which then kills its children
(`close`). The child also ends on its own when the server is gone: its pipe closes (while it serves)
or its parent's sentinel fires (while it loads), so no search process outlives its server. A child
that dies first raises `SearchProcessDied` in the search that finds it gone; its `sentinel` also
becomes readable, so a supervisor (`pool.py`) learns of a death while the process is idle too.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import multiprocessing.resource_tracker
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import tqdm

from retriever_server.errors import IndexLoadError
from retriever_server.index import Searcher
from retriever_server.lone_threads import LoneThreads
from retriever_server.options import LoadOptions

# the thread counts torch (intra-op), OpenBLAS/MKL, faiss (OpenMP), numba and inductor's compiler read
# when they load (a compiler at 1 thread compiles in-process: no worker pool to leave behind on a stop)
THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMBA_NUM_THREADS",
    "TORCHINDUCTOR_COMPILE_THREADS",
)


class SearchProcessDied(RuntimeError):
    """The search process ended (killed, crashed, out of memory) while a search needed it."""


STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}  # the server's to handle, never a search process's


class SearchProcess:
    """A `Searcher` loaded and run in a child process: `search(queries, k)`, plus the index
    `description`. Made, the child is started and loading; `wait_ready()` blocks until it has loaded
    (a failure raises the child's `IndexLoadError`); `close()` kills it, loaded or not."""

    def __init__(self, index_dir: Path, options: LoadOptions, *, warm_up_depth: int):
        context = multiprocessing.get_context("spawn")  # no fork of a process with threads running
        self._pipe, child_end = context.Pipe()
        self._process = context.Process(
            target=_serve_searches,
            args=(child_end, Path(index_dir), options, warm_up_depth),
            name="retriever-search",
            daemon=True,
        )
        # the child starts with the stop signals blocked (a signal mask survives exec) until it ignores them;
        # the resource tracker is started first, as starting it unblocks them in this thread
        multiprocessing.resource_tracker.ensure_running()
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            with _environment(dict.fromkeys(THREAD_VARIABLES, str(options.threads))):  # read by the child's libraries
                self._process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        child_end.close()  # the child holds the only other end: its exit is an EOF here
        self.description: dict = {}

    def wait_ready(self) -> SearchProcess:
        """Block until the child has loaded its index and warmed up; itself, for chaining."""
        try:
            failed, payload = self._pipe.recv()
        except (EOFError, OSError):
            reason = self.reap()
            raise IndexLoadError(f"the search process exited while loading ({reason})") from None
        if failed:
            self.close()
            raise payload
        self.description = payload
        return self

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def sentinel(self) -> int:
        """A file descriptor that becomes readable when the process ends."""
        return self._process.sentinel

    def is_alive(self) -> bool:
        return self._process.is_alive()

    def search(self, queries: list[str], k: int, lone: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Top-k (rows, scores) of each query, searched by the child; called by one thread at a time.
        `lone`: the batch is the server's only work (the child may lend it the idle cores)."""
        try:
            self._pipe.send((queries, k, lone))
            failed, payload = self._pipe.recv()
        except (EOFError, OSError):
            raise SearchProcessDied(f"search process {self.pid} is gone") from None
        if failed:
            raise payload
        return payload

    def reap(self) -> str:
        """Wait for the ended process (a few seconds at most) and say how it ended."""
        self._pipe.close()
        self._process.join(timeout=5)
        code = self._process.exitcode
        if code is None:
            return "still running"
        if code < 0:
            with contextlib.suppress(ValueError):
                return f"killed by {signal.Signals(-code).name}"
        return f"exit code {code}"

    def close(self) -> None:
        """Kill the child now, whatever it is doing (it holds nothing that needs a clean exit)."""
        self._pipe.close()
        if self._process.exitcode is None:
            self._process.kill()
        self._process.join()


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """`os.environ` updated with `values` inside the block (a spawned child inherits it), restored after."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _serve_searches(pipe, index_dir: Path, options: LoadOptions, warm_up_depth: int) -> None:
    """The child: load, warm up, report ready (or the error), then answer batches until the pipe closes."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # as spawned; made sure of before ignoring them
    for stop in STOP_SIGNALS:
        signal.signal(stop, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # one sent meanwhile is dropped, being ignored
    threading.Thread(target=_exit_with_parent, name="retriever-parent-watch", daemon=True).start()
    # bm25s makes a tqdm bar (hidden) per tokenize call, and tqdm's default lock holds a multiprocessing
    # semaphore, which a killed process leaves to the resource tracker; one process needs a thread lock
    tqdm.tqdm.set_lock(threading.RLock())
    try:
        searcher = Searcher(index_dir, options)
        searcher.search(["warm up"], warm_up_depth)  # JIT compilation and first-call costs before "ready"
    except Exception as exc:
        pipe.send((True, exc if isinstance(exc, IndexLoadError) else IndexLoadError(f"{type(exc).__name__}: {exc}")))
        return
    try:
        pipe.send((False, searcher.description))
    except OSError:  # the server stopped while this process loaded
        return
    # the query encoder's threads, per batch (BM25's numba cannot exceed the threads it started with)
    dense = searcher.kind == "dense"
    threads = LoneThreads(options.threads, options.lone_threads) if dense else None
    while True:
        try:
            queries, k, lone = pipe.recv()
        except (EOFError, OSError):
            return
        if threads is not None:
            threads.before(len(queries), lone)
        try:
            reply = (False, searcher.search(queries, k))
        except Exception as exc:  # the server turns it into a 500 for this batch's callers
            reply = (True, RuntimeError(f"search failed: {type(exc).__name__}: {exc}"))
        try:
            pipe.send(reply)
        except OSError:
            return


def _exit_with_parent() -> None:
    """End this process as soon as the server's is gone, whatever the main thread is doing (loading
    an index can take minutes, and would end in writing to a closed pipe)."""
    multiprocessing.connection.wait([multiprocessing.parent_process().sentinel])
    os._exit(0)
