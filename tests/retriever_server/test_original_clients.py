"""The released clients' requests, replayed against a real server: each test sends what one client
sends (with `requests`, as they all do) and reads the answer the way that client reads it.

- Search-R1 `search_r1/llm_agent/generation.py` and MEM1 `Mem1/train/rollout/llm_agent/generation_think.py`:
  every turn posts `{"queries", "topk", "return_scores": True}` for the samples that search (an empty
  list when none does; a query is whatever stood between `<search>` tags, stripped: maybe ""), then
  reads `["result"]` and each hit's `["document"]["contents"]`.
- verl 0.7.1 `verl/tools/utils/search_r1_like_utils.py`: the same body with JSON headers, retried on
  500-504, `raise_for_status()` on anything else, then `.get("result", [])`.
- MemSearcher `memsearcher/inference/memsearcher.py`: posts the model's tool-call `arguments` as the
  body of `/search` (skipping only a query that is exactly ""), shows any non-200 to the model as
  `error: <status>`, else joins each hit's `["contents"]`.
- FlashRAG's `RemoteRetriever` (in MemSearcher's tree): `{"query", "top_n", "return_score"}`, and with
  return_score unpacks the answer as `(documents, scores)`.
"""

import json

import pytest
import requests

NUMPY_BM25 = ("--bm25-backend", "numpy")
TOTO = "Jeff Porcaro drummer Toto"


@pytest.fixture(scope="module")
def url(retriever_server, bm25_index_dir):
    return retriever_server(bm25_index_dir, *NUMPY_BM25).url


def search_r1_turn(url: str, queries: list[str], topk: int = 3) -> list[str]:
    """Search-R1's and MEM1's `batch_search`: one formatted string per query."""
    payload = {"queries": queries, "topk": topk, "return_scores": True}
    results = requests.post(f"{url}/retrieve", json=payload).json()["result"]
    formatted = []
    for result in results:
        text = ""
        for idx, item in enumerate(result):
            content = item["document"]["contents"]
            title, _, body = content.partition("\n")
            text += f"Doc {idx + 1}(Title: {title}) {body}\n"
        formatted.append(text)
    return formatted


def verl_search(url: str, queries: list[str], topk: int = 3) -> tuple[dict | None, str | None]:
    """verl 0.7.1's `call_search_api` (one attempt): (response JSON, None) or (None, the error)."""
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    response = requests.post(f"{url}/retrieve", headers=headers, json={"queries": queries, "topk": topk,
                                                                      "return_scores": True}, timeout=30)  # fmt: skip
    if response.status_code in (500, 502, 503, 504):
        return None, f"Server Error ({response.status_code})"
    try:
        response.raise_for_status()
    except requests.exceptions.HTTPError as exc:
        return None, str(exc)
    return response.json(), None


def memsearcher_tool_call(url: str, tool_call: str) -> str:
    """MemSearcher's agent executing one `wikipedia_search` tool call."""
    data = json.loads(tool_call)["arguments"]
    if data.get("query", "") == "":
        return "invalid query"
    response = requests.post(f"{url}/search", json=data, timeout=10)
    if response.status_code != 200:
        return f"error: {response.status_code}"
    return "".join(f"{line['contents']}\\n\\n" for line in response.json()).strip()


def test_search_r1_and_mem1_turns_with_no_search_empty_and_stop_word_queries(url):
    assert search_r1_turn(url, []) == []  # a turn in which no sample searches
    empty, stop_words, toto = search_r1_turn(url, ["", "the of a", TOTO])
    assert empty == "" and stop_words == ""
    assert toto.startswith('Doc 1(Title: "Jeff Porcaro") ') and toto.count("\nDoc ") == 2


def test_verl_search_tool_gets_results_and_no_errors(url):
    response, error = verl_search(url, [TOTO, "?!"])
    assert error is None
    toto, nothing = response.get("result", [])
    assert [hit["document"]["contents"].split("\n")[0] for hit in toto][0] == '"Jeff Porcaro"'
    assert nothing == []
    assert verl_search(url, []) == ({"result": []}, None)


@pytest.mark.parametrize(
    ("arguments", "documents"),
    [
        ({"query": TOTO}, 10),  # MemSearcher's server default
        ({"query": TOTO, "top_n": 5}, 5),
        ({"query": TOTO, "top_n": "3"}, 3),
        ({"query": TOTO, "top_n": 0}, 1),
        ({"query": TOTO, "top_n": 100}, 50),  # clamped to --topk-max
        ({"query": TOTO, "num_results": 4}, 10),
        ({"query": TOTO, "top_n": 2, "language": "en"}, 2),
    ],
)
def test_memsearcher_lax_tool_call_arguments(url, arguments, documents):
    tool_call = json.dumps({"name": "wikipedia_search", "arguments": arguments})
    shown = memsearcher_tool_call(url, tool_call)
    assert not shown.startswith("error:")
    # the agent's separator is a literal backslash-n pair, which its .strip() leaves after the last passage
    assert shown.startswith('"Jeff Porcaro"\n') and shown.count("\\n\\n") == documents


def test_memsearcher_blank_and_missing_queries(url):
    assert memsearcher_tool_call(url, '{"name": "wikipedia_search", "arguments": {"query": "   "}}') == ""
    assert memsearcher_tool_call(url, '{"name": "wikipedia_search", "arguments": {"query": ""}}') == "invalid query"
    listed = '{"name": "wikipedia_search", "arguments": {"query": ["a", "b"]}}'
    assert memsearcher_tool_call(url, listed) == "error: 422"


def test_flashrag_remote_retriever_unpacks_documents_and_scores(url):
    documents, scores = requests.post(f"{url}/search", json={"query": TOTO, "top_n": 4, "return_score": True}).json()
    assert len(documents) == len(scores) == 4 and set(documents[0]) == {"id", "contents"}
    batch = {"query": [TOTO, "the"], "top_n": 4, "return_score": True}
    batch_documents, batch_scores = requests.post(f"{url}/batch_search", json=batch).json()
    assert batch_documents == [documents, []] and batch_scores == [scores, []]
    bare = requests.post(f"{url}/batch_search", json={"query": [TOTO], "top_n": 4, "return_score": False}).json()
    assert bare == [documents]
