"""Under load the answers equal the sequential ones, whatever a batch mixes; malformed bodies are all
4xx; hang-ups and stops are quiet; bad indexes fail clearly."""

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memagent_examples.retriever_process import NUMPY_BM25

# numba scoring (the default) compiles for tens of seconds at start-up; tested once, in-process


@pytest.fixture(scope="module")
def uncached(retriever_server, bm25_index_dir):
    """No cache, so every concurrent answer is searched again (batched with strangers, by either of two
    search processes), not replayed; a 2 ms wait lets concurrent requests meet in one batch."""
    flags = ("--cache-size", "0", "--search-processes", "2", "--max-wait-ms", "2")
    return retriever_server(bm25_index_dir, *NUMPY_BM25, *flags)


@pytest.fixture(scope="module")
def uncached_url(uncached):
    return uncached.url


async def test_hundreds_of_concurrent_requests_equal_sequential_answers(uncached_url, questions):
    bodies = [{"queries": [q], "topk": 1 + i % 5, "return_scores": True} for i, q in enumerate(questions[:300])]
    bodies += [{"queries": questions[i : i + 4], "topk": 3, "return_scores": True} for i in range(0, 200, 4)]
    limits = httpx.Limits(max_connections=400)
    async with httpx.AsyncClient(base_url=uncached_url, timeout=120, limits=limits) as client:
        sequential = [(await client.post("/retrieve", json=body)).json() for body in bodies]
        before = (await client.get("/stats")).json()
        responses = await asyncio.gather(*(client.post("/retrieve", json=body) for body in bodies))
        after = (await client.get("/stats")).json()
    assert all(r.status_code == 200 for r in responses)
    assert [r.json() for r in responses] == sequential
    batches, searched = after["batches"] - before["batches"], after["searched"] - before["searched"]
    print(f"{searched} queries searched in {batches} batches")
    assert batches < searched, "concurrent queries were never coalesced"
    per_process = zip(after["batches_per_search_process"], before["batches_per_search_process"], strict=True)
    spread = [a - b for a, b in per_process]
    assert len(spread) == 2 and min(spread) > 0, f"both search processes should take batches: {spread}"


NOTHING_TO_SEARCH = ["", "   ", "?!", "the of a", "the", "...", "\t\n", "a an the"]
any_query = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=40),  # what UTF-8 can carry
    st.sampled_from(NOTHING_TO_SEARCH),
    st.sampled_from(["Toto band", "Jeff Porcaro", "Evan Morris lobbyist", "who directed Harry Potter?"]),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(any_query, min_size=1, max_size=6))
async def test_each_answer_is_the_one_searched_alone_whatever_its_batch(uncached_url, batch):
    """Sent alone first; then the whole batch in one request while each query is also sent in a request of
    its own, concurrently, so they are coalesced with each other in the server's batches."""
    body = {"queries": batch, "topk": 3, "return_scores": True}
    async with httpx.AsyncClient(base_url=uncached_url, timeout=60) as client:
        alone = [(await client.post("/retrieve", json={**body, "queries": [q]})).json()["result"][0] for q in batch]
        singles = (client.post("/retrieve", json={**body, "queries": [q]}) for q in batch)
        together, *singles = await asyncio.gather(client.post("/retrieve", json=body), *singles)
    assert together.status_code == 200 and all(single.status_code == 200 for single in singles)
    assert together.json()["result"] == alone
    assert [single.json()["result"][0] for single in singles] == alone
    assert all(hits == [] for q, hits in zip(batch, alone, strict=True) if q in NOTHING_TO_SEARCH)


def test_search_processes_share_the_cores(uncached):
    """By default each of N search processes runs (usable cores - 1) / N threads in every library."""
    expected = str(max(1, (len(os.sched_getaffinity(0)) - 1) // 2))
    pids = uncached.search_pids()
    assert len(pids) == 2
    for pid in pids:
        environ = dict(v.split("=", 1) for v in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in v)
        assert [environ[name] for name in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS")] == [expected, expected]


def test_a_client_that_hangs_up_mid_body_costs_one_log_line(retriever_server, bm25_index_dir):
    """And the server stays healthy; stopped, it leaves nothing behind in its log."""
    server = retriever_server(bm25_index_dir, *NUMPY_BM25)
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as connection:
        head = b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        connection.sendall(head + b'{"queries": ["Toto')
    deadline = time.monotonic() + 10
    while httpx.get(f"{server.url}/stats").json()["disconnects"] == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert httpx.post(f"{server.url}/retrieve", json={"queries": ["Toto"]}).status_code == 200
    server.stop()
    log = server.log.read_text().splitlines()
    assert [line for line in log if "hung up" in line] == [
        "WARNING:  retriever_server: POST /retrieve: the client hung up after 18 of 100 body bytes"
    ]
    assert not [line for line in log if "Traceback" in line or "leaked" in line], log


@pytest.fixture(scope="module")
def malformed_url(retriever_server, bm25_index_dir):
    return retriever_server(bm25_index_dir, *NUMPY_BM25, "--max-queries", "8", "--max-body-bytes", "4096").url


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=20,
)
wrong_fields = st.fixed_dictionaries(
    {},
    optional={
        "queries": json_values | st.lists(json_values, max_size=10) | st.lists(st.text(max_size=5), min_size=9),
        "topk": json_values | st.integers(min_value=-5, max_value=1000),
        "return_scores": json_values,
        "extra": json_values,
    },
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.one_of(json_values.map(json.dumps), wrong_fields.map(json.dumps), st.binary(max_size=300)))
def test_any_body_gets_an_answer_or_a_4xx_naming_the_problem(malformed_url, body):
    for path in ("/retrieve", "/search", "/batch_search"):
        response = httpx.post(f"{malformed_url}{path}", content=body, timeout=30)
        assert response.status_code == 200 or (400 <= response.status_code < 500 and response.json()["detail"]), (
            body,
            response.text,
        )
        if path == "/retrieve" and response.status_code == 200:
            assert len(response.json()["result"]) == len(json.loads(body)["queries"])


def test_server_still_answers_after_malformed_bodies(malformed_url):
    """Runs after the hypothesis test above (file order) on the same server process."""
    assert httpx.get(f"{malformed_url}/health").json()["status"] == "ready"
    response = httpx.post(f"{malformed_url}/retrieve", json={"queries": ["Toto"], "topk": 2})
    assert response.status_code == 200 and len(response.json()["result"][0]) == 2


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL])
def test_no_process_outlives_its_server(retriever_server, bm25_index_dir, stop):
    """Each searcher runs in a child process; they end with the server, even one killed outright."""
    server = retriever_server(bm25_index_dir, *NUMPY_BM25, "--search-processes", "2")
    children = _children(server.process.pid)
    assert len(server.search_pids()) == 2, "each searcher should run in a child process of its own"
    assert httpx.post(f"{server.url}/retrieve", json={"queries": ["Toto"]}).status_code == 200
    server.process.send_signal(stop)
    server.process.wait(timeout=60)
    deadline = time.monotonic() + 30
    while any(map(_alive, children)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(_alive, children))


def _vm_hwm_mb(pid: int | str) -> float:
    (line,) = [line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmHWM:")]
    return int(line.split()[1]) / 1024


def test_peak_rss_counts_the_search_process(retriever_server, bm25_index_dir):
    """The index lives in the search process: a server's memory is both processes', not the HTTP one's."""
    server = retriever_server(bm25_index_dir, *NUMPY_BM25)
    pid = server.process.pid
    (searcher,) = server.search_pids()
    assert server.peak_rss_mb() >= round(_vm_hwm_mb(pid) + _vm_hwm_mb(searcher), 1) > _vm_hwm_mb(pid)


def _serve(index_dir, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "retriever_server", "serve", "--index", str(index_dir), "--port", "0", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("option", ["--search-processes", "--threads", "--lone-threads"])
def test_process_and_thread_counts_must_be_positive(bm25_index_dir, option):
    result = _serve(bm25_index_dir, option, "0")
    assert result.returncode == 2 and f"{option}: expected at least 1, got 0" in result.stderr


def test_missing_index_is_a_clear_start_up_error(tmp_path):
    result = _serve(tmp_path / "absent")
    assert result.returncode == 2 and "no such directory" in result.stderr and "build" in result.stderr
    result = _serve(tmp_path)
    assert result.returncode == 2 and "meta.json: missing" in result.stderr


def test_corrupt_index_is_a_clear_start_up_error(tmp_path, bm25_index_dir):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(bm25_index_dir, broken)
    (broken / "meta.json").write_text("{not json")
    result = _serve(broken)
    assert result.returncode == 2 and "meta.json: corrupt" in result.stderr

    shutil.copy(bm25_index_dir / "meta.json", broken / "meta.json")
    for name in ("data.csc.index.npy", "params.index.json"):
        (broken / "bm25" / name).write_bytes(b"garbage")
    result = _serve(broken)
    assert result.returncode == 1
    assert "cannot serve" in result.stderr and "cannot load the bm25 index" in result.stderr

    shutil.rmtree(broken / "corpus")
    result = _serve(broken)
    assert result.returncode == 1 and "data.bin: missing" in result.stderr


def test_build_errors_name_the_problem(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "0", "contents": "ok"}\n{"id": "1"}\n')
    command = [sys.executable, "-m", "retriever_server", "build", "--out", str(tmp_path / "out"), "--corpus", str(bad)]
    result = subprocess.run([*command, "--kind", "bm25"], capture_output=True, text=True)
    assert result.returncode == 2 and f"{bad}:2:" in result.stderr
    result = subprocess.run([*command, "--kind", "dense"], capture_output=True, text=True)
    assert result.returncode == 2 and "--kind dense needs --encoder" in result.stderr
