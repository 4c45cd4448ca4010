"""The limits on what a request may cost: queries per request, body size (refused while it is read,
chunked too), head size and fields, and how long a head or a body may take. Each refusal names its
limit and closes the connection. Sent with raw sockets, so the test controls every byte."""

import select
import socket
import time

import httpx
import pytest

from memagent_examples.retriever_process import NUMPY_BM25

LIMITS = (
    "--max-queries",
    "8",
    "--max-body-bytes",
    "4096",
    "--max-header-bytes",
    "2048",
    "--max-headers",
    "20",
    "--header-timeout-s",
    "1",
    "--body-timeout-s",
    "1",
    "--keep-alive-s",
    "1",
)
HEAD = b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


@pytest.fixture(scope="module")
def server(retriever_server, bm25_index_dir):
    return retriever_server(bm25_index_dir, *NUMPY_BM25, *LIMITS)


def until_closed(connection: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a timeout fails the test)."""
    received = b""
    try:
        while chunk := connection.recv(65536):
            received += chunk
    except ConnectionResetError:  # the client sent on after the server closed: the end all the same
        pass
    return received


def answered(connection: socket.socket) -> bool:
    return bool(select.select([connection], [], [], 0)[0])


def status_and_body(answer: bytes) -> tuple[int, str]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"connection: close" in head.lower(), head
    return int(head.split()[1]), body.decode()


def test_more_queries_than_the_limit_is_a_422_naming_the_flag(server):
    response = httpx.post(f"{server.url}/retrieve", json={"queries": ["a"] * 9})
    assert response.status_code == 422
    assert response.json()["detail"] == "queries: 9 queries, over the limit of 8 (--max-queries)"
    response = httpx.post(f"{server.url}/batch_search", json={"query": ["a"] * 9})
    assert response.status_code == 422 and response.json()["detail"].startswith("query: 9 queries")
    assert httpx.post(f"{server.url}/retrieve", json={"queries": ["a"] * 8}).status_code == 200


def test_a_declared_body_over_the_limit_is_refused_unread(server):
    with server.connect() as connection:
        connection.sendall(HEAD + b"Content-Length: 5000\r\n\r\n")  # and no body
        status, body = status_and_body(until_closed(connection))
    assert status == 413 and "5000 bytes, over the limit of 4096 (--max-body-bytes)" in body


def test_a_chunked_body_is_refused_once_over_the_limit(server):
    """No length declared: the server reads it up to the limit, answers, and closes the connection
    without waiting for the rest (the chunked body never ends here)."""
    chunk = b"400\r\n" + b'{"queries": ["' + b"x" * (1024 - 14) + b"\r\n"
    with server.connect() as connection:
        connection.sendall(HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunk * 5)
        status, body = status_and_body(until_closed(connection))
    assert status == 413 and "over the limit of 4096 bytes (--max-body-bytes)" in body


@pytest.mark.parametrize(
    ("extra", "detail"),
    [
        (b"X-Big: " + b"v" * 3000 + b"\r\n", "request head: over the limit of 2048 bytes"),
        (b"".join(b"X-%d: v\r\n" % i for i in range(25)), "request head: more than 20 header fields"),
    ],
)
def test_a_head_over_the_limits_is_a_431(server, extra, detail):
    with server.connect() as connection:
        connection.sendall(HEAD + extra + b"Content-Length: 2\r\n\r\n{}")
        status, body = status_and_body(until_closed(connection))
    assert status == 431 and detail in body


def test_a_head_that_never_ends_is_cut_off_bounded(server):
    """Sent in pieces, never finished: counted as it arrives, refused at the limit."""
    with server.connect() as connection:
        connection.sendall(HEAD + b"X-Endless: ")
        for _ in range(8):
            time.sleep(0.05)
            if answered(connection):
                break
            connection.sendall(b"v" * 512)
        status, body = status_and_body(until_closed(connection))
    assert status == 431 and "over the limit of 2048 bytes" in body


def test_slow_and_silent_connections_are_closed_after_the_header_timeout(server):
    """100 connections stopping halfway through their heads, 10 trickling a byte every 0.2 s, 10
    sending nothing: all closed (408) within the 1 s header timeout, while others are served."""
    before = httpx.get(f"{server.url}/stats").json()["head_timeouts"]
    stalled = [server.connect() for _ in range(100)]
    for connection in stalled:
        connection.sendall(HEAD[:30])
    trickling = [server.connect() for _ in range(10)]
    silent = [server.connect() for _ in range(10)]
    for byte in HEAD[:10]:  # a byte every 0.2 s: 2 s in all
        for connection in trickling:
            if not answered(connection):
                connection.sendall(bytes([byte]))
        assert httpx.post(f"{server.url}/retrieve", json={"queries": ["Toto"]}).status_code == 200
        time.sleep(0.2)
    for connection in stalled + trickling + silent:
        status, body = status_and_body(until_closed(connection))
        assert status == 408 and "not complete within 1 s" in body
        connection.close()
    assert httpx.get(f"{server.url}/stats").json()["head_timeouts"] - before == 120


def test_a_stalled_body_is_closed_after_the_body_timeout_with_one_log_line(server):
    with server.connect() as connection:
        connection.sendall(HEAD + b"Content-Length: 100\r\n\r\n" + b'{"queries":')
        status, body = status_and_body(until_closed(connection))
    assert status == 408 and "body: no byte for 1 s (--body-timeout-s)" in body
    lines = [line for line in server.log.read_text().splitlines() if "no body byte" in line]
    assert lines == ["WARNING:  retriever_server: POST /retrieve: no body byte for 1 s after 11 of 100; closed"]
    assert httpx.get(f"{server.url}/health").json()["status"] == "ready"


def test_an_idle_connection_is_closed_after_the_keep_alive_timeout(server):
    """Answered and kept alive, then closed once idle past --keep-alive-s (1 s here, 5 s by default)."""
    body = b'{"queries": ["Toto"]}'
    with server.connect() as connection:
        connection.sendall(HEAD + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.endswith(b"}]]}"):
            answer += connection.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200") and b"connection: close" not in answer.lower()
        connection.settimeout(4.5)  # sooner than uvicorn's default of 5 s
        assert until_closed(connection) == b""
