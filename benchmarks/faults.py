"""What `retriever_faults.py` does to the retriever, and how it watches: clients that never read their answers
or send their heads a byte at a time, a killer of search processes, and a /health poller of its own."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import signal
import threading
import time

from memagent_examples.retriever_process import ServerProcess
from verl_memagent.search.endpoint import retriever_health

CRASH_WINDOW_S = 10.0  # the server's default --crash-window-s


def big_answer_request(port: int, queries: list[str]) -> bytes:
    body = json.dumps({"queries": queries, "topk": 50, "return_scores": True}).encode()
    head = f"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
    return f"{head}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body


async def slow_readers(port: int, request: bytes, count: int, stop: asyncio.Event) -> None:
    """`count` clients that send `request` and never read the answer, until `stop`."""
    writers = []
    for _ in range(count):
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        writers.append(writer)
    await stop.wait()
    for writer in writers:
        writer.close()


async def slowloris(port: int, count: int, stop: asyncio.Event, closed: list[int]) -> None:
    """`count` connections sending a head a byte every 0.5 s; each closed by the server is opened again."""
    head = b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nX-Pad: " + b"p" * 200

    async def one() -> None:
        while not stop.is_set():
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            with contextlib.suppress(ConnectionError):
                for byte in head:
                    if stop.is_set():
                        break
                    writer.write(bytes([byte]))
                    await writer.drain()
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(reader.read(65536), 0.5)  # the server's 408, or its close
                        closed[0] += 1
                        break
            writer.close()

    await asyncio.gather(*(one() for _ in range(count)))


def poll_health(port: int, stop, out) -> None:
    """(monotonic time, latency s, status or 0 for a failure) of GET /health every 20 ms, until `stop`."""
    samples, connection = [], None
    while not stop.is_set():
        asked = time.monotonic()
        try:
            connection = connection or http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            connection.request("GET", "/health")
            response = connection.getresponse()
            response.read()
            status = response.status
        except (OSError, http.client.HTTPException):
            status, connection = 0, None
        samples.append((asked, time.monotonic() - asked, status))
        time.sleep(max(0.0, 0.02 - (time.monotonic() - asked)))
    out.put(samples)


class Killer(threading.Thread):
    """Every `every_s`, SIGKILL one search process while another is live too, `most` times or until `stop`. The
    server's first processes may die at any time; a restarted one only once it has been live longer
    than the crash window (sooner, the server stops: a crash loop, as it should)."""

    def __init__(self, server: ServerProcess, every_s: float, most: int):
        super().__init__(daemon=True)
        self.server, self.every_s, self.most = server, every_s, most
        self.stop, self.kills = threading.Event(), 0
        self._live_since = dict.fromkeys(server.search_pids(), -float("inf"))

    def run(self) -> None:
        while self.kills < self.most and not self.stop.wait(self.every_s):
            live = retriever_health(self.server.url, 30)["search_processes_live"]
            pids, now = self.server.search_pids(), time.monotonic()
            if live == len(pids):  # all live: those not seen live before are live from now (or earlier)
                for pid in pids:
                    self._live_since.setdefault(pid, now)
            ready = [pid for pid in pids if now - self._live_since.get(pid, now) > CRASH_WINDOW_S + 1]
            if live >= 2 and ready:
                os.kill(ready[0], signal.SIGKILL)
                self.kills += 1
