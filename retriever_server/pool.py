"""The supervised search processes: a process that dies is restarted while the others keep serving.

A death is noticed three ways, whichever comes first: the search that finds its pipe closed, the
process's sentinel becoming readable on the event loop (so an idle death is seen at once), and
`live()`, which /health calls, checking each process. The caller of `search` gets
`SearchProcessDied` and decides what to do with the queries (the engine retries them once on a
live process). Each death and each restart is one line in the log. A restarted process that dies
again within `crash_window_s` of its restart is a crash loop: the pool calls `on_fatal` with the
cause, and the server stops, as it does when a restart fails to load.

`close()` is a stop: from then on nothing is restarted, and every process is killed at once,
loading or serving (the pool knows each from the moment it is spawned).

Everything but waiting for a load and searching runs on the event loop. The wait runs in daemon
threads (an interrupted server does not wait for an index to finish loading), searching in one
thread per process, each waiting on its pipe without holding the GIL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np

from retriever_server.errors import IndexLoadError
from retriever_server.search_process import SearchProcess, SearchProcessDied

_log = logging.getLogger("uvicorn.error")  # the server's log, at its --log-level
T = TypeVar("T")


class _Slot:
    """One search process's place in the pool: the process while it is live, None while it restarts."""

    def __init__(self, index: int):
        self.index = index
        self.process: SearchProcess | None = None
        self.loading: SearchProcess | None = None  # spawned, not yet ready
        self.live = asyncio.Event()
        self.ready_since = 0.0
        self.restarted = False


class SearchPool:
    """`size` search processes made by `start_process`, supervised on the running event loop."""

    def __init__(
        self,
        start_process: Callable[[], SearchProcess],
        size: int,
        *,
        crash_window_s: float = 10.0,
        on_fatal: Callable[[str], None],
    ):
        if size < 1 or crash_window_s < 0:
            raise ValueError("size must be positive and crash_window_s non-negative")
        self._start_process = start_process
        self._crash_window_s = crash_window_s
        self._on_fatal = on_fatal
        self._slots = [_Slot(i) for i in range(size)]
        self._executor = ThreadPoolExecutor(max_workers=size, thread_name_prefix="search")
        self._restarts: set[asyncio.Task] = set()
        self._closed = False
        self.restarted = 0
        self.description: dict = {}

    def __len__(self) -> int:
        return len(self._slots)

    async def start(self) -> None:
        """Start every process at once and wait until all are ready."""
        await asyncio.gather(*(self._launch(slot) for slot in self._slots))
        self.description = self._slots[0].process.description

    async def _launch(self, slot: _Slot) -> SearchProcess:
        """Spawn slot's process (the pool can kill it from now on), wait for it to load, attach it."""
        if self._closed:
            raise IndexLoadError("the server is stopping")
        process = slot.loading = self._start_process()
        try:
            await in_daemon_thread(process.wait_ready)
        except BaseException:  # a failed load, or cancelled: no process is left behind
            process.close()
            raise
        finally:
            slot.loading = None
        if self._closed:  # stopped while the load's result was on its way
            process.close()
            raise IndexLoadError("the server is stopping")
        self._attach(slot, process)
        return process

    def live(self) -> int:
        """How many processes can search now; a process found dead here is handled at once."""
        for slot in self._slots:
            if slot.process is not None and not slot.process.is_alive():
                self._died(slot, slot.process)
        return sum(slot.process is not None for slot in self._slots)

    def is_live(self, index: int) -> bool:
        return self._slots[index].process is not None

    async def wait_live(self, index: int) -> None:
        await self._slots[index].live.wait()

    async def search(self, index: int, queries: list[str], k: int, lone: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Top-k rows and scores from process `index` (`lone`: the server's only work);
        `SearchProcessDied` if it is down or dies."""
        slot = self._slots[index]
        process = slot.process
        if process is None:
            raise SearchProcessDied(f"search process {index} is restarting")
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, process.search, queries, k, lone)
        except SearchProcessDied:
            self._died(slot, process)
            raise

    def _attach(self, slot: _Slot, process: SearchProcess) -> None:
        slot.process, slot.ready_since = process, time.monotonic()
        asyncio.get_running_loop().add_reader(process.sentinel, self._died, slot, process)
        slot.live.set()

    def _died(self, slot: _Slot, process: SearchProcess) -> None:
        if slot.process is not process or self._closed:  # already handled, or a stop: no restart
            return
        asyncio.get_running_loop().remove_reader(process.sentinel)
        slot.process = None
        slot.live.clear()
        uptime = time.monotonic() - slot.ready_since
        task = asyncio.get_running_loop().create_task(self._restart(slot, process, uptime))
        self._restarts.add(task)
        task.add_done_callback(self._restarts.discard)

    async def _restart(self, slot: _Slot, dead: SearchProcess, uptime: float) -> None:
        reason = await in_daemon_thread(dead.reap)
        name = f"search process {slot.index} (pid {dead.pid})"
        if self._closed:
            return
        if slot.restarted and uptime < self._crash_window_s:
            self._on_fatal(f"{name} died again {uptime:.1f} s after its restart ({reason}): a crash loop")
            return
        _log.warning(
            "retriever_server: %s died (%s) after %.1f s; %d of %d live; restarting it",
            name,
            reason,
            uptime,
            self.live(),
            len(self),
        )
        started = time.monotonic()
        try:
            process = await self._launch(slot)
        except Exception as exc:
            if not self._closed:
                self._on_fatal(f"{name} died ({reason}) and could not be restarted: {exc}")
            return
        slot.restarted = True
        self.restarted += 1
        _log.warning(
            "retriever_server: search process %d restarted (pid %d) in %.1f s; %d of %d live",
            slot.index,
            process.pid,
            time.monotonic() - started,
            self.live(),
            len(self),
        )

    def close(self) -> None:
        """Stop: no restart from now on, and every process killed now, loading or serving."""
        self._closed = True
        for task in list(self._restarts):
            task.cancel()
        for slot in self._slots:
            if slot.process is not None:
                with contextlib.suppress(RuntimeError):  # the loop may be closed already
                    asyncio.get_running_loop().remove_reader(slot.process.sentinel)
            for process in (slot.process, slot.loading):
                if process is not None:
                    process.close()
            slot.process = slot.loading = None
            slot.live.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)


def in_daemon_thread(function: Callable[[], T]) -> asyncio.Future[T]:
    """`function()` run in a daemon thread, awaitable on the running loop (a result that comes after
    the wait was cancelled is dropped). Unlike the loop's executor, a daemon thread does not hold up
    the interpreter's exit (an index may take minutes to load)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result=None, error: BaseException | None = None) -> None:
        if future.done():  # cancelled: nobody waits for the result
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def run() -> None:
        try:
            result, error = function(), None
        except BaseException as exc:  # handed to the awaiting coroutine
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop has closed: the server is gone
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name="retriever-load", daemon=True).start()
    return future
