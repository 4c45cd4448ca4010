"""RetrieverClient against real retriever server processes (BM25 index of the bundled corpus)."""

import asyncio
import socket

import httpx
import pytest
from aiohttp import web

from memagent_examples.retriever_process import NUMPY_BM25
from verl_memagent.search import Document, RetrieverClient, RetrieverError, format_documents

# numba scoring (the default) compiles for tens of seconds at start-up; tested once, in-process
MAX_QUERIES = 64  # the module's server refuses more queries a request: a real client mistake (422)

QUERIES = ["Jeff Porcaro drummer", "Pietro Germi director", "Old Frisian language", "Leda river Leer", "Toto band"]


@pytest.fixture(scope="module")
def server(retriever_server, bm25_index_dir):
    return retriever_server(bm25_index_dir, *NUMPY_BM25, "--max-queries", str(MAX_QUERIES))


def _dead_url() -> str:
    with socket.socket() as sock:  # a port nobody listens on once this closes
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


async def test_search_parses_titles_and_formats_for_prompts(server):
    raw = httpx.post(f"{server.url}/retrieve", json={"queries": QUERIES, "topk": 3, "return_scores": True}).json()
    async with RetrieverClient(server.url) as client:
        docs = await client.search(QUERIES, topk=3)
    assert len(docs) == len(QUERIES) and all(len(d) == 3 for d in docs)
    for per_query, raw_hits in zip(docs, raw["result"], strict=True):
        for doc, hit in zip(per_query, raw_hits, strict=True):
            assert doc == Document(hit["document"]["id"], hit["document"]["contents"], hit["score"])
    first = format_documents(docs[0]).split("\n")[0]
    assert first.startswith("Doc 1(Title: Jeff Porcaro) Jeffrey Thomas Porcaro (April 1, 1954")


async def test_batches_and_many_coroutines_share_one_client(server):
    queries = [f"{q} {i}" for i in range(8) for q in QUERIES]
    async with RetrieverClient(server.url) as whole:
        expected = await whole.search(queries, topk=2)
    async with RetrieverClient(server.url, batch_size=7) as client:
        assert await client.search(queries, topk=2) == expected
        singles = await asyncio.gather(*(client.search([q], topk=2) for q in queries))
    assert [s[0] for s in singles] == expected
    assert await RetrieverClient(server.url).search([], topk=3) == []


def test_client_works_across_event_loops(server):
    client = RetrieverClient(server.url)
    first = asyncio.run(client.search(QUERIES[:1], topk=1))
    second = asyncio.run(client.search(QUERIES[:1], topk=1))  # a new loop gets a new connection pool
    assert first == second and first[0][0].title == "Jeff Porcaro"


async def test_failover_skips_a_dead_replica(server):
    dead = _dead_url()
    async with RetrieverClient(server.url) as client:
        expected = await client.search(QUERIES * 4, topk=1)
    async with RetrieverClient([dead, server.url], backoff_s=0.01) as client:
        results = await asyncio.gather(*(client.search([q], topk=1) for q in QUERIES * 4))
    assert [r[0] for r in results] == expected
    async with RetrieverClient([dead], max_retries=2, backoff_s=0.01) as client:
        with pytest.raises(RetrieverError, match="after 3 attempts.*ConnectError"):
            await client.search(QUERIES, topk=1)


async def test_load_spreads_over_replicas(server, retriever_server, bm25_index_dir):
    second = retriever_server(bm25_index_dir, *NUMPY_BM25)
    before = [httpx.get(f"{url}/stats").json()["requests"].get("retrieve", 0) for url in (server.url, second.url)]
    async with RetrieverClient([server.url, second.url]) as client:
        await asyncio.gather(*(client.search([f"spread {i}"], topk=1) for i in range(60)))
    after = [httpx.get(f"{url}/stats").json()["requests"].get("retrieve", 0) for url in (server.url, second.url)]
    served = [a - b for a, b in zip(after, before, strict=True)]
    assert sum(served) == 60 and min(served) >= 15, served


async def test_5xx_is_retried_and_4xx_is_not(server):
    """A real HTTP proxy in front of the server answers 503 to the first two requests."""
    seen = []

    async def flaky(request: web.Request) -> web.Response:
        seen.append(request.path)
        if len(seen) <= 2:
            return web.Response(status=503, text="overloaded")
        async with httpx.AsyncClient() as upstream:
            answer = await upstream.post(f"{server.url}{request.path}", content=await request.read())
        return web.Response(status=answer.status_code, body=answer.content, content_type="application/json")

    app = web.Application()
    app.router.add_post("/retrieve", flaky)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    proxy = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    try:
        async with RetrieverClient(proxy, max_retries=3, backoff_s=0.01) as client:
            docs = await client.search(QUERIES[:1], topk=1)
            assert docs[0][0].title == "Jeff Porcaro" and len(seen) == 3
            too_many = MAX_QUERIES + 1
            with pytest.raises(RetrieverError, match=f"HTTP 422.*queries: {too_many} queries, over the limit"):
                await client.search(["Toto band"] * too_many, topk=1)
            assert len(seen) == 4  # no retry of a client mistake
        seen.clear()
        async with RetrieverClient(proxy, max_retries=1, backoff_s=0.01) as client:
            with pytest.raises(RetrieverError, match="after 2 attempts.*HTTP 503"):
                await client.search(QUERIES[:1], topk=1)
    finally:
        await runner.cleanup()


async def test_bearer_token(retriever_server, bm25_index_dir, monkeypatch):
    monkeypatch.setenv("CLIENT_TEST_TOKEN", "t0ken")
    url = retriever_server(bm25_index_dir, *NUMPY_BM25, "--token-env", "CLIENT_TEST_TOKEN").url
    async with RetrieverClient(url, token="t0ken") as client:
        assert (await client.search(QUERIES[:1], topk=1))[0][0].title == "Jeff Porcaro"
    async with RetrieverClient(url) as client:
        with pytest.raises(RetrieverError, match="HTTP 401"):
            await client.search(QUERIES[:1], topk=1)


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="urls"):
        RetrieverClient("localhost:8000")
    client = RetrieverClient("http://127.0.0.1:1")
    with pytest.raises(TypeError, match="queries"):
        asyncio.run(client.search("one string", topk=3))
    with pytest.raises(ValueError, match="topk"):
        asyncio.run(client.search(["q"], topk=0))
