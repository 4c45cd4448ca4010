"""The one retriever health probe (`search.endpoint`) against a real server: ready and degraded answer,
503 and a closed port do not, and the command's exit status says the same for shell scripts."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from memagent_examples.retriever_process import NUMPY_BM25
from verl_memagent.agent.settings import AgentSettings, build_settings
from verl_memagent.search.endpoint import (
    DEFAULT_RETRIEVER_URL,
    RETRIEVER_URL_ENV,
    RetrieverUnavailable,
    configured_retriever_urls,
    retriever_health,
)


def probe_command(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "verl_memagent.search.endpoint", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


@pytest.fixture
def closed_url():
    with socket.socket() as sock:  # bound, never listening: connection refused
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def health_until(url: str, status: str, timeout_s: float = 30.0) -> dict:
    """`retriever_health(url)` until it says `status`: its body then."""
    deadline = time.monotonic() + timeout_s
    while (body := retriever_health(url))["status"] != status:
        assert time.monotonic() < deadline, f"{url} never said {status}"
        time.sleep(0.01)
    return body


def test_a_ready_and_a_degraded_server_answer_and_one_without_live_processes_does_not(retriever_server, bm25_index_dir):
    server = retriever_server(bm25_index_dir, *NUMPY_BM25, "--search-processes", "2")
    assert retriever_health(server.url + "/")["status"] == "ready"
    done = probe_command(server.url)
    assert (done.returncode, done.stdout) == (0, f"{server.url}: ready\n")

    os.kill(server.search_pids()[0], signal.SIGKILL)  # one of two: 200 degraded while it restarts
    assert health_until(server.url, "degraded")["search_processes_live"] == 1
    health_until(server.url, "ready")

    lone = retriever_server(bm25_index_dir, *NUMPY_BM25)
    os.kill(lone.search_pids()[0], signal.SIGKILL)  # none live: 503 until the restart
    with pytest.raises(RetrieverUnavailable, match=r"/health answers 503 degraded"):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            retriever_health(lone.url)
            time.sleep(0.01)


def test_a_closed_port_fails_and_the_command_names_it(closed_url, retriever_server, bm25_index_dir):
    with pytest.raises(RetrieverUnavailable, match=f"{closed_url}/health does not answer"):
        retriever_health(closed_url, timeout_s=2)
    server = retriever_server(bm25_index_dir, *NUMPY_BM25)
    done = probe_command(f"{server.url}, {closed_url}")  # every URL must answer
    assert done.returncode == 1 and done.stdout == f"{server.url}: ready\n"
    assert f"{closed_url}/health does not answer" in done.stderr
    assert probe_command("--quiet", closed_url).stderr == ""


def test_the_default_address_is_the_settings_and_the_environments_list_replaces_it(monkeypatch):
    monkeypatch.delenv(RETRIEVER_URL_ENV, raising=False)
    assert configured_retriever_urls() == [DEFAULT_RETRIEVER_URL] == AgentSettings().retriever_urls
    # the shipped YAML's `${oc.env:MEMAGENT_RETRIEVER_URL,null}` when the variable is unset
    assert build_settings("memsearcher", {}, {"retriever_urls": None}).retriever_urls == [DEFAULT_RETRIEVER_URL]
    monkeypatch.setenv(RETRIEVER_URL_ENV, "http://a:1, http://b:2,")
    assert configured_retriever_urls() == ["http://a:1", "http://b:2"]
