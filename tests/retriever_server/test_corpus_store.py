"""The memory-mapped passage store: both input formats, O(1) lookups equal to the source, clear errors."""

import json

import numpy as np
import pytest

from retriever_server.corpus import CorpusError, CorpusStore, build_store


def test_store_of_bundled_corpus_returns_every_row_unchanged(tmp_path, data_dir):
    lines = (data_dir / "corpus.jsonl").read_text(encoding="utf-8").splitlines()
    assert build_store(data_dir / "corpus.jsonl", tmp_path) == len(lines) == 14230
    store = CorpusStore(tmp_path)
    assert len(store) == len(lines)
    rows = np.random.default_rng(0).choice(len(lines), size=300, replace=False).tolist() + [0, len(lines) - 1]
    for row in rows:
        source = json.loads(lines[row])
        assert store.doc_id(row) == source["id"]
        assert store.contents(row) == source["contents"]
    assert store.read(rows) == [(store.doc_id(row), store.contents(row)) for row in rows]
    assert store.read([]) == []


def test_title_text_rows_become_wiki18_contents_and_ids_become_strings(tmp_path):
    corpus = tmp_path / "c.jsonl"
    rows = [{"id": 7, "title": "Ünïcode", "text": "body\nline"}, {"id": "x", "contents": '"T"\nt'}]
    corpus.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n\n")
    build_store(corpus, tmp_path / "store")
    store = CorpusStore(tmp_path / "store")
    assert [store.doc_id(i) for i in range(2)] == ["7", "x"]
    assert [store.contents(i) for i in range(2)] == ['"Ünïcode"\nbody\nline', '"T"\nt']
    assert list(store.iter_contents(1)) == ['"T"\nt']


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"id": "1", "contents": "ok"', "not valid JSON"),
        ('["id", "contents"]', 'expected an object with "id"'),
        ('{"contents": "no id"}', 'expected an object with "id"'),
        ('{"id": "1", "title": "only a title"}', 'needs a string "contents"'),
        ('{"id": true, "contents": "x"}', '"id" must be a string or an integer'),
        ('{"id": "1", "contents": "caf\udce9"}', "not UTF-8"),  # a Latin-1 byte
    ],
)
def test_malformed_line_is_an_error_naming_file_and_line(tmp_path, line, message):
    corpus = tmp_path / "bad.jsonl"
    corpus.write_bytes(b'{"id": "0", "contents": "fine"}\n\n' + line.encode("utf-8", "surrogateescape") + b"\n")
    with pytest.raises(CorpusError, match=message) as info:
        build_store(corpus, tmp_path / "store")
    assert f"{corpus}:3:" in str(info.value)


def test_missing_empty_and_truncated_stores_are_clear_errors(tmp_path, data_dir):
    with pytest.raises(CorpusError, match="corpus file not found"):
        build_store(tmp_path / "absent.jsonl", tmp_path / "s0")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(CorpusError, match="holds no passages"):
        build_store(tmp_path / "empty.jsonl", tmp_path / "s1")
    with pytest.raises(CorpusError, match="data.bin: missing"):
        CorpusStore(tmp_path / "nowhere")
    build_store(data_dir / "corpus.jsonl", tmp_path / "s2")
    data = tmp_path / "s2" / "data.bin"
    data.write_bytes(data.read_bytes()[:-10])
    with pytest.raises(CorpusError, match="truncated or corrupt"):
        CorpusStore(tmp_path / "s2")
