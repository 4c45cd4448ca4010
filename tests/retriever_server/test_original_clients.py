"""The released clients' requests, replayed against a real server: each test sends what one client
sends (with `requests`, as they all do) and reads the answer the way that client reads it.

- Search-R1 `search_r1/llm_agent/generation.py` and MEM1 `Mem1/train/rollout/llm_agent/generation_think.py`
  (the same request and reading code; Search-R1 a14dc3a, MEM1 6f22061): every turn posts
  `{"queries", "topk", "return_scores": True}` for all the samples of the batch that search, in one
  request (an empty list when none does; a query is whatever stood between `<search>` tags,
  stripped: maybe ""), then reads `["result"]` and each hit's `["document"]["contents"]`. Anything
  but a 200 kills the rollout (`KeyError: 'result'`). Search-R1's `train_grpo.sh` runs 512 prompts
  x 5 samples: 2,560 queries in one request.
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

from memagent_examples.retriever_process import NUMPY_BM25

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
    response = requests.post(
        f"{url}/retrieve", headers=headers, json={"queries": queries, "topk": topk, "return_scores": True}, timeout=30
    )
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


def paper_turn(questions: list[str], prompts: int, samples: int) -> list[str]:
    """One turn of a GRPO batch: each of `prompts` questions sampled `samples` times, every sample
    writing a query of its own (the question, reworded, cut short, or nothing between its tags)."""
    rewordings = (str, str.lower, lambda q: f"{q} wikipedia", lambda q: " ".join(q.split()[:6]), lambda q: "")
    return [rewordings[j % 5](questions[i % len(questions)]) for i in range(prompts) for j in range(samples)]


@pytest.mark.parametrize(("prompts", "samples"), [(512, 5), (1024, 16)])
def test_search_r1_and_mem1_turns_at_the_papers_batch_size(url, questions, prompts, samples):
    """2,560 queries in one request (Search-R1's 512 x 5), and 16,384 (1,024 x 16): each answer is
    the one its query gets in a small request."""
    queries = paper_turn(questions, prompts, samples)
    formatted = search_r1_turn(url, queries)
    distinct = list(dict.fromkeys(queries))
    alone = {}
    for start in range(0, len(distinct), 256):
        chunk = distinct[start : start + 256]
        alone.update(zip(chunk, search_r1_turn(url, chunk), strict=True))
    assert formatted == [alone[q] for q in queries]
    assert sum(text.startswith("Doc 1(Title: ") for text in formatted) > 0.7 * len(queries)


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
