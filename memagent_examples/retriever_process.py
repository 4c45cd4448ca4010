"""Run a retriever server as a child process on a free loopback port and wait until it is ready.

The examples' sweeps, the benchmarks and the tests start servers the same way: the command gets `--port-file FILE`
(with `--port 0` the server binds a free port and writes it there), and the server counts as up
once `GET /health` answers (`verl_memagent.search.endpoint`'s probe). The child's stderr goes to a log
file that start-up errors quote; its folder is removed when the Python process that started the server
exits (the log stays readable after `stop()`).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from verl_memagent.search.endpoint import RetrieverUnavailable, retriever_health

#: serve BM25 with numpy scoring: starts at once (numba compiles for tens of seconds)
NUMPY_BM25 = ("--bm25-backend", "numpy")


def build_command(kind: str, corpus: str | os.PathLike, out: str | os.PathLike, *args: str) -> list[str]:
    """`python -m retriever_server build` of a `kind` index of `corpus` into `out`, with extra build options."""
    paths = ["--corpus", str(corpus), "--out", str(out)]
    return [sys.executable, "-m", "retriever_server", "build", "--kind", kind, *paths, *args]


def serve_command(index_dir: str | os.PathLike, *args: str) -> list[str]:
    """`python -m retriever_server serve` on a free port for `index_dir`, with extra serve options."""
    return [sys.executable, "-m", "retriever_server", "serve", "--index", str(index_dir), "--port", "0", *args]


def _interruptible() -> None:
    """SIGINT as a terminal delivers it: a shell's background job (`scripts/test.sh &`) starts with SIGINT
    ignored, and a child inherits that, so a server under test would take Ctrl-C as no signal at all."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class ServerProcess:
    """A server child process; `url` is set once it answers `/health`. Stop it with `stop()`.

    `ready=False` returns as soon as the process is started (`wait_ready()` waits later);
    `own_session=True` starts it in a session (and process group) of its own, whose id is its pid:
    a signal to the group reaches the server's processes only, and `session_pids()` finds every
    process it started, orphans included."""

    def __init__(
        self,
        command: list[str],
        *,
        timeout_s: float = 180.0,
        cwd: str | os.PathLike | None = None,
        ready: bool = True,
        own_session: bool = False,
    ):
        work = Path(tempfile.mkdtemp(prefix="retriever_"))
        atexit.register(shutil.rmtree, work, ignore_errors=True)
        self._port_file, self.log = work / "port", work / "server.log"
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        command = [*command, "--port-file", str(self._port_file)]
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                command, env=env, cwd=cwd, stderr=log, start_new_session=own_session, preexec_fn=_interruptible
            )
        self.started = time.monotonic()
        if ready:
            self.wait_ready(timeout_s)

    def wait_ready(self, timeout_s: float = 180.0, every_s: float = 0.2) -> float:
        """Wait until `/health` answers; the seconds since the process was started."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}: {self.log.read_text()[-2000:]}")
            if self._port_file.is_file() and self._port_file.read_text():
                self.url = f"http://127.0.0.1:{self._port_file.read_text()}"
                if self._healthy():
                    return time.monotonic() - self.started
            time.sleep(every_s)
        self.stop()
        raise RuntimeError(f"server not ready after {timeout_s} s: {self.log.read_text()[-2000:]}")

    def _healthy(self) -> bool:
        try:
            retriever_health(self.url)
        except RetrieverUnavailable:
            return False
        return True

    def search_pids(self) -> list[int]:
        """The server's search processes (its children but multiprocessing's resource tracker)."""
        children = [
            int(pid)
            for task in Path(f"/proc/{self.process.pid}/task").glob("*/children")
            for pid in task.read_text().split()
        ]
        return [pid for pid in children if "spawn_main" in _read(f"/proc/{pid}/cmdline")]

    def session_pids(self) -> list[int]:
        """The processes, zombies aside, of the session the server leads (`own_session=True`): its own
        and every one it started, whoever their parent is now."""
        self.process.poll()  # reap the server itself once it has ended
        pids = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            fields = _read(str(stat)).rpartition(")")[2].split()  # after "pid (name)": state, ppid, pgrp, session
            if len(fields) > 3 and fields[0] != "Z" and int(fields[3]) == self.process.pid:
                pids.append(int(stat.parent.name))
        return pids

    def rss_mb(self) -> float:
        """Resident memory of the server and its search processes now (Linux /proc VmRSS), in MB."""
        return round(sum(status_kb(pid, "VmRSS") for pid in with_descendants(self.process.pid)) / 1024, 1)

    def peak_rss_mb(self) -> float:
        """Peak resident memory of the server and its search process (Linux /proc VmHWM), in MB.

        The sum of each process's own peak: an upper bound of their peak together, which also counts
        the memory-mapped pages both read twice."""
        return round(sum(status_kb(pid, "VmHWM") for pid in with_descendants(self.process.pid)) / 1024, 1)

    def connect(self, timeout_s: float = 10.0) -> socket.socket:
        """A raw TCP connection to the server, for tests that write HTTP by hand."""
        host, port = self.url.removeprefix("http://").split(":")
        return socket.create_connection((host, int(port)), timeout=timeout_s)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=60)


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:  # the process has ended meanwhile
        return ""


def with_descendants(pid: int) -> list[int]:
    """`pid` and every process below it, from /proc/PID/task/*/children (any thread may have started one)."""
    pids = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in _read(str(task)).split():
            pids += with_descendants(int(child))
    return pids


def status_kb(pid: int, field: str) -> int:
    for line in _read(f"/proc/{pid}/status").splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return 0
