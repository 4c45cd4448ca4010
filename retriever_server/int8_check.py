"""Does the int8 query encoder keep the fp32 one's recall on this index? Checked when a dense index is
built, so that the CPU server's int8 default (several times fp32's queries/s where the CPU has
AVX-512 VNNI; elsewhere servers run fp32, `quantize.int8_slow_here`) is earned by the model at hand,
not assumed from another model.

Quantising each activation row to 8 bits fails for models whose activations carry outlier channels:
a few dimensions far larger than the rest set the row's scale and crush the others to zero. With no
labelled questions for an arbitrary corpus, the check searches known-item pseudo-queries: an 8-word
window of a sampled passage's text, searched among up to 20,000 of the index's own passage vectors.
int8 is kept when it finds the source passage in its top 10 for at most max(2, 1% of the queries)
fewer queries than fp32: a margin that int8 MiniLM stays within and a model with outlier channels
does not (both tested).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from retriever_server.corpus import CorpusStore
from retriever_server.encoders import Encoder, EncoderSpec
from retriever_server.options import Quantize

QUERIES = 512
POOL = 20_000  # passages searched: enough to make known items hard to find, cheap at any corpus size
WINDOW_WORDS = 8
TOP = 10


def pseudo_query(contents: str, rng: np.random.Generator) -> str:
    """An 8-word window of a passage's text (its title line left out, as a question would)."""
    words = (contents.partition("\n")[2] or contents).split()
    start = int(rng.integers(0, max(1, len(words) - WINDOW_WORDS + 1)))
    return " ".join(words[start : start + WINDOW_WORDS])


def check_int8_queries(
    spec: EncoderSpec, store: CorpusStore, vectors: Callable[[np.ndarray], np.ndarray], *, seed: int = 0
) -> dict:
    """Known-item recall of fp32 and int8 query vectors against the passage `vectors` of sampled rows
    (sorted row numbers in, float32 [rows, dim] out), their cosines, and whether int8 keeps recall."""
    rng = np.random.default_rng(seed)
    pool = np.sort(rng.choice(len(store), size=min(POOL, len(store)), replace=False))
    sources = rng.choice(len(pool), size=min(QUERIES, len(pool)), replace=False)  # positions in `pool`
    queries = [pseudo_query(store.contents(int(pool[i])), rng) for i in sources]
    passages = torch.from_numpy(np.ascontiguousarray(vectors(pool), dtype=np.float32))
    encoded, found = {}, {}
    for quantize in Quantize:
        # eager: the server's compiled int8 computes the same sums, in another order
        encoder = Encoder(spec, device="cpu", quantize=quantize, runner="eager")
        encoded[quantize] = torch.from_numpy(encoder.encode_queries(queries))
        top = torch.topk(encoded[quantize] @ passages.T, min(TOP, len(pool)), dim=1).indices.numpy()
        found[quantize] = top == sources[:, None]  # [query, rank]: the source passage at that rank
    cosine = torch.nn.functional.cosine_similarity(encoded[Quantize.NONE], encoded[Quantize.INT8], dim=1)
    lost = int(found[Quantize.NONE].any(axis=1).sum() - found[Quantize.INT8].any(axis=1).sum())
    return {
        "queries": len(queries),
        "pool": len(pool),
        "recall_at_1": {name.value: round(float(hits[:, 0].mean()), 4) for name, hits in found.items()},
        f"recall_at_{TOP}": {name.value: round(float(hits.any(axis=1).mean()), 4) for name, hits in found.items()},
        "cosine_mean": round(float(cosine.mean()), 4),
        "cosine_min": round(float(cosine.min()), 4),
        "kept": lost <= max(2, round(0.01 * len(queries))),
    }


def summary(check: dict) -> str:
    """One line for the build's output."""
    recall = check[f"recall_at_{TOP}"]
    verdict = "kept" if check["kept"] else "lost recall: CPU servers encode queries in fp32 (--quantize int8 overrides)"
    return (
        f"int8 query encoder: known-item recall@{TOP} {recall[Quantize.INT8]} (fp32 {recall[Quantize.NONE]}) on "
        f"{check['queries']} pseudo-queries, cosine to fp32 {check['cosine_mean']}: {verdict}"
    )
