"""A search process that dies (kill -9) is restarted; the queries it was searching are searched again
on a live one, so no well-behaved client sees an error; /health says degraded meanwhile; the log
has one line per death and per restart; a crash loop stops the server with its cause."""

import asyncio
import contextlib
import os
import signal
import threading
import time

import httpx
import pytest

from memagent_examples.retriever_process import NUMPY_BM25


def wait_until(condition, timeout_s: float = 60.0, every_s: float = 0.02) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(every_s)


def health(url: str) -> tuple[int, dict]:
    response = httpx.get(f"{url}/health", timeout=10)
    return response.status_code, response.json()


def event_lines(server) -> list[str]:
    log = server.log.read_text().splitlines()
    assert not [line for line in log if "Traceback" in line or "never retrieved" in line], log
    return [line for line in log if " died " in line or " restarted " in line]


def test_an_idle_search_process_killed_is_restarted(retriever_server, bm25_index_dir):
    server = retriever_server(bm25_index_dir, *NUMPY_BM25)
    toto = httpx.post(f"{server.url}/retrieve", json={"queries": ["Toto band"]}).json()
    (pid,) = server.search_pids()
    os.kill(pid, signal.SIGKILL)
    seen = []
    wait_until(lambda: seen.append(health(server.url)) or seen[-1][1]["status"] != "ready", timeout_s=5)
    assert seen[-1] == (
        503,
        {
            "status": "degraded",
            "kind": "bm25",
            "num_passages": 14230,
            "search_processes": 1,
            "search_processes_live": 0,
        },
    )
    # sent while no search process is live: it waits for the restart
    assert httpx.post(f"{server.url}/retrieve", json={"queries": ["Toto band"]}, timeout=60).json() == toto
    wait_until(lambda: health(server.url)[1]["status"] == "ready")
    (restarted,) = server.search_pids()
    assert restarted != pid and httpx.get(f"{server.url}/stats").json()["search_process_restarts"] == 1
    died, back = event_lines(server)
    assert f"search process 0 (pid {pid}) died (killed by SIGKILL)" in died and "0 of 1 live; restarting" in died
    assert f"search process 0 restarted (pid {restarted})" in back and "1 of 1 live" in back


async def test_a_search_process_killed_under_load_costs_no_request(retriever_server, bm25_index_dir, questions):
    """One request of 3,600 queries keeps both search processes busy (no cache: all are searched);
    one is killed mid-batch. Its batch is searched again by the other, the request and 48
    single-query requests sent meanwhile all get 200 and the answers they get without a kill."""
    server = retriever_server(bm25_index_dir, *NUMPY_BM25, "--search-processes", "2", "--cache-size", "0")
    queries = [f"{q} {suffix}" for suffix in ("", "film", "band", "wikipedia", "born") for q in questions][:3600]
    big = {"queries": queries, "topk": 3, "return_scores": True}
    singles = [{"queries": [q], "topk": 3} for q in questions[:48]]
    async with httpx.AsyncClient(base_url=server.url, timeout=300) as client:
        expected = [(await client.post("/retrieve", json=body)).json() for body in [big, *singles]]
        before = (await client.get("/stats")).json()
        sent = [asyncio.create_task(client.post("/retrieve", json=big))]
        while (await client.get("/stats")).json()["queries"] - before["queries"] < len(queries):
            await asyncio.sleep(0.01)  # the big request is being searched
        os.kill(server.search_pids()[0], signal.SIGKILL)
        sent += [asyncio.create_task(client.post("/retrieve", json=body)) for body in singles]
        statuses = []
        while not all(task.done() for task in sent):
            statuses.append((await client.get("/health")).json()["status"])
            await asyncio.sleep(0.05)
        answers = [task.result() for task in sent]
        after = (await client.get("/stats")).json()
    assert [answer.status_code for answer in answers] == [200] * len(answers)
    assert [answer.json() for answer in answers] == expected
    assert "degraded" in statuses
    assert after["retried"] > 0 and after["failed"] == 0
    wait_until(lambda: health(server.url)[1]["status"] == "ready")
    assert [line.split(":  ")[1].split(" (pid")[0] for line in event_lines(server)] == [
        "retriever_server: search process 0",
        "retriever_server: search process 0 restarted",
    ]


def test_a_crash_loop_stops_the_server_with_its_cause(retriever_server, bm25_index_dir):
    """A restarted process that dies again within --crash-window-s (10 s) of its restart."""
    server = retriever_server(bm25_index_dir, *NUMPY_BM25)
    (killed,) = server.search_pids()
    os.kill(killed, signal.SIGKILL)
    # "ready" alone may be read before the server has seen the death: wait for the restarted process too
    wait_until(lambda: server.search_pids() not in ([], [killed]) and health(server.url)[1]["status"] == "ready")
    (restarted,) = server.search_pids()
    os.kill(restarted, signal.SIGKILL)
    assert server.process.wait(timeout=60) == 1
    log = server.log.read_text()
    # the killed processes left nothing for multiprocessing's resource tracker to clean up
    assert "leaked semaphore" not in log
    (stopped,) = [line for line in log.splitlines() if "cannot serve" in line]
    assert f"cannot serve {bm25_index_dir}: search process 0 (pid {restarted}) died again" in stopped
    assert "after its restart (killed by SIGKILL): a crash loop" in stopped


STOP_WITHIN_S = 1.0


@pytest.mark.parametrize("phase", ["loading", "serving"])
@pytest.mark.parametrize("to", ["process", "group"])
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_ends_every_process_of_the_server_within_a_second(bm25_index_dir, data_dir, stop, to, phase):
    """Ctrl-C (SIGINT to the group), `kill` (SIGTERM to the server), `docker stop`, systemd: while the
    index loads, or while a request of 3,600 queries is being searched. No process the server started
    is left a second later, none was restarted, and the log holds no traceback."""
    from memagent_examples.retriever_process import ServerProcess, serve_command

    command = serve_command(bm25_index_dir, *NUMPY_BM25, "--cache-size", "0", "--search-processes", "2")
    server = ServerProcess(command, cwd=data_dir.parent, ready=phase == "serving", own_session=True)
    in_flight = None
    try:
        if phase == "loading":
            wait_until(lambda: len(server.session_pids()) >= 3, timeout_s=30, every_s=0.005)  # server + 2 searchers
            assert "ready" not in server.log.read_text()
        else:
            queries = [f"question {i} film band" for i in range(3600)]
            in_flight = threading.Thread(target=_post_quietly, args=(server.url, queries), daemon=True)
            in_flight.start()
            wait_until(lambda: httpx.get(f"{server.url}/stats").json()["queries"] >= len(queries), timeout_s=30)
        assert len(server.session_pids()) >= 3
        sent = time.monotonic()
        (os.killpg if to == "group" else os.kill)(server.process.pid, stop)
        wait_until(lambda: not server.session_pids(), timeout_s=10, every_s=0.01)
        took = time.monotonic() - sent
        time.sleep(0.5)  # a process restarted late would show up here
        assert not server.session_pids()
    finally:
        if server.process.poll() is None:
            os.killpg(server.process.pid, signal.SIGKILL)
    assert took < STOP_WITHIN_S, f"stopped in {took:.2f} s"
    assert server.process.returncode == -stop  # ended by the signal, as an interrupted command should
    assert event_lines(server) == []  # no death, no restart, no traceback
    assert "cannot serve" not in server.log.read_text()


@pytest.fixture(scope="module")
def dense_index_dir(tmp_path_factory, data_dir, minilm_dir):
    """A MiniLM torch index of the corpus' first 50 passages: small, but its search processes load torch
    and the encoder, the load whose orphans #37 fixed."""
    import subprocess

    from memagent_examples.retriever_process import build_command

    work = tmp_path_factory.mktemp("dense_stop")
    corpus = work / "corpus.jsonl"
    corpus.write_text("".join((data_dir / "corpus.jsonl").read_text(encoding="utf-8").splitlines(True)[:50]))
    command = build_command("dense", corpus, work / "index", "--encoder", minilm_dir, "--index-type", "torch")
    subprocess.run(command, check=True, capture_output=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return work / "index"


def _loads_torch(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/maps") as maps:
            return "libtorch" in maps.read()
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_while_the_dense_encoder_loads_leaves_no_process(dense_index_dir, data_dir, stop):
    """The group stopped while both search processes are loading torch and the query encoder: every
    process ends by the signal within a second, none is restarted, and the log holds no traceback."""
    from memagent_examples.retriever_process import ServerProcess, serve_command

    command = serve_command(dense_index_dir, "--search-processes", "2")
    server = ServerProcess(command, cwd=data_dir.parent, ready=False, own_session=True)
    try:
        wait_until(lambda: len(server.search_pids()) == 2, timeout_s=60, every_s=0.005)
        wait_until(lambda: all(_loads_torch(pid) for pid in server.search_pids()), timeout_s=60, every_s=0.005)
        assert "ready" not in server.log.read_text()
        sent = time.monotonic()
        os.killpg(server.process.pid, stop)
        wait_until(lambda: not server.session_pids(), timeout_s=10, every_s=0.01)
        took = time.monotonic() - sent
        time.sleep(0.5)  # a process restarted late would show up here
        assert not server.session_pids()
    finally:
        if server.process.poll() is None:
            os.killpg(server.process.pid, signal.SIGKILL)
    assert took < STOP_WITHIN_S, f"stopped in {took:.2f} s"
    assert server.process.returncode == -stop
    assert event_lines(server) == []
    assert "cannot serve" not in server.log.read_text()


def _post_quietly(url: str, queries: list[str]) -> None:
    """A request the stop cuts short: how it ends is not the test's business."""
    with contextlib.suppress(httpx.HTTPError):
        httpx.post(f"{url}/retrieve", json={"queries": queries}, timeout=60)
