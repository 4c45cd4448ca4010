"""Under load the answers equal the sequential ones; malformed bodies are all 4xx; bad indexes fail clearly."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# numba scoring (the default) compiles for tens of seconds at start-up; tested once, in-process
NUMPY_BM25 = ("--bm25-backend", "numpy")


@pytest.fixture(scope="module")
def uncached_url(retriever_server, bm25_index_dir):
    """No cache, so every concurrent answer is searched again (batched with strangers, by either of two
    search processes), not replayed."""
    return retriever_server(bm25_index_dir, *NUMPY_BM25, "--cache-size", "0", "--search-processes", "2").url


@pytest.fixture(scope="module")
def questions(data_dir):
    return [json.loads(line)["question"] for line in (data_dir / "qa_multihop.jsonl").read_text().splitlines()]


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
).filter(lambda body: not _valid_retrieve(body))


def _valid_retrieve(body) -> bool:
    queries, topk = body.get("queries"), body.get("topk")
    return (
        set(body) <= {"queries", "topk", "return_scores"}
        and isinstance(queries, list)
        and 1 <= len(queries) <= 8
        and all(isinstance(q, str) for q in queries)
        and (topk is None or (type(topk) is int and 1 <= topk <= 50))
        and type(body.get("return_scores", False)) is bool
    )


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.one_of(json_values.map(json.dumps), wrong_fields.map(json.dumps), st.binary(max_size=300)))
def test_malformed_bodies_are_all_4xx(malformed_url, body):
    for path in ("/retrieve", "/search", "/batch_search"):
        response = httpx.post(f"{malformed_url}{path}", content=body, timeout=30)
        if path == "/retrieve":
            assert 400 <= response.status_code < 500, (body, response.text)
        else:
            assert response.status_code < 500, (body, response.text)
        assert response.json()["detail"]


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


def _search_processes(pid: int) -> list[int]:
    """The server's search processes, beside multiprocessing's resource tracker."""
    return [child for child in _children(pid) if "spawn_main" in Path(f"/proc/{child}/cmdline").read_text()]


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL])
def test_no_process_outlives_its_server(retriever_server, bm25_index_dir, stop):
    """Each searcher runs in a child process; they end with the server, even one killed outright."""
    server = retriever_server(bm25_index_dir, *NUMPY_BM25, "--search-processes", "2")
    children = _children(server.process.pid)
    assert len(_search_processes(server.process.pid)) == 2, "each searcher should run in a child process of its own"
    assert httpx.post(f"{server.url}/retrieve", json={"queries": ["Toto"]}).status_code == 200
    server.process.send_signal(stop)
    server.process.wait(timeout=60)
    deadline = time.monotonic() + 30
    while any(map(_alive, children)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(_alive, children))


def test_a_server_whose_search_process_dies_exits_with_the_reason(retriever_server, bm25_index_dir):
    server = retriever_server(bm25_index_dir, *NUMPY_BM25)
    assert httpx.post(f"{server.url}/retrieve", json={"queries": ["Toto"]}).status_code == 200
    (searcher,) = _search_processes(server.process.pid)
    os.kill(searcher, signal.SIGKILL)
    assert httpx.post(f"{server.url}/retrieve", json={"queries": ["Porcaro"]}).status_code == 500
    assert server.process.wait(timeout=60) == 1
    assert "the search process is gone (exit code -9)" in server.log.read_text()


def _vm_hwm_mb(pid: int | str) -> float:
    (line,) = [line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmHWM:")]
    return int(line.split()[1]) / 1024


def test_peak_rss_counts_the_search_process(retriever_server, bm25_index_dir):
    """The index lives in the search process: a server's memory is both processes', not the HTTP one's."""
    server = retriever_server(bm25_index_dir, *NUMPY_BM25)
    pid = server.process.pid
    (searcher,) = _search_processes(pid)
    assert server.peak_rss_mb() >= round(_vm_hwm_mb(pid) + _vm_hwm_mb(searcher), 1) > _vm_hwm_mb(pid)


def _serve(index_dir, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "retriever_server", "serve", "--index", str(index_dir), "--port", "0", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_search_processes_must_be_positive(bm25_index_dir):
    result = _serve(bm25_index_dir, "--search-processes", "0")
    assert result.returncode == 2 and "--search-processes: expected at least 1, got 0" in result.stderr


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
    good = tmp_path / "good.jsonl"
    good.write_text('{"id": "0", "contents": "ok"}\n')
    command[command.index(str(bad))] = str(good)
    result = subprocess.run([*command, "--kind", "pyserini"], capture_output=True, text=True)
    assert result.returncode == 2 and "pyserini" in result.stderr and "Java 21" in result.stderr
