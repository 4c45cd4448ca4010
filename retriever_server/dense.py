"""Vector indexes over passage embeddings (inner product on normalised vectors = cosine).

- `flat`: faiss IndexFlatIP, exact; memory-mapped at load (Search-R1's `e5_Flat.index` loads as is).
- `hnsw`: faiss IndexHNSWFlat, approximate, fast on CPU.
- `ivfpq`: faiss IndexIVFPQ, approximate, compressed for CPU memory.
- `torch`: the embedding matrix itself, searched by matrix product: fp16 and sharded over the visible
  GPUs when there are any (no faiss-gpu needed), fp32 on CPU.
"""

from __future__ import annotations

import math
from pathlib import Path

import faiss
import numpy as np
import torch
from tqdm import tqdm

FAISS_KINDS = ("flat", "hnsw", "ivfpq")
INDEX_KINDS = (*FAISS_KINDS, "torch")
FAISS_FILE = "faiss.index"
EMBEDDINGS_FILE = "embeddings.npy"


def build_faiss(embeddings: np.ndarray, kind: str, path: Path, *, chunk: int = 65536, show_progress: bool = True):
    """Build a faiss index of `kind` from float32 [n, d] embeddings and write it to `path`."""
    n, dim = embeddings.shape
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, 32, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = 200
    elif kind == "ivfpq":
        if dim % 8:
            raise ValueError(f"ivfpq needs an embedding size divisible by 8, got {dim}")
        nlist = max(1, min(int(4 * math.sqrt(n)), n // 39))
        index = faiss.IndexIVFPQ(faiss.IndexFlatIP(dim), dim, nlist, dim // 8, 8, faiss.METRIC_INNER_PRODUCT)
        sample = np.random.default_rng(0).choice(n, size=min(n, 256 * nlist), replace=False)
        index.train(np.ascontiguousarray(embeddings[np.sort(sample)]))
    else:
        raise ValueError(f"index kind: expected one of {INDEX_KINDS}, got {kind!r}")
    for start in tqdm(range(0, n, chunk), desc=f"faiss {kind}", disable=not show_progress):
        index.add(np.ascontiguousarray(embeddings[start : start + chunk]))
    faiss.write_index(index, str(path))


class FaissIndex:
    """A faiss index read from disk (memory-mapped where the index type allows it)."""

    def __init__(self, path: Path, *, nprobe: int = 32, ef_search: int = 128):
        flags = faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY
        try:
            self._index = faiss.read_index(str(path), flags)
        except RuntimeError:
            self._index = faiss.read_index(str(path))
        if hasattr(self._index, "nprobe"):
            self._index.nprobe = nprobe
        self._ef_search = ef_search
        self.ntotal, self.dim = int(self._index.ntotal), int(self._index.d)

    def search(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if isinstance(self._index, faiss.IndexHNSW):
            self._index.hnsw.efSearch = max(self._ef_search, k)
        scores, rows = self._index.search(np.ascontiguousarray(vectors, dtype=np.float32), k)
        return rows.astype(np.int64), scores


class TorchIndex:
    """Exact inner-product search by matrix product; rows sharded over the visible GPUs."""

    def __init__(self, path: Path, *, devices: list[torch.device] | None = None):
        matrix = np.load(path, mmap_mode="r")
        if matrix.ndim != 2:
            raise ValueError(f"{path}: expected a 2-D embedding matrix, got shape {matrix.shape}")
        if devices is None:
            devices = [torch.device(f"cuda:{i}") for i in range(torch.cuda.device_count())] or [torch.device("cpu")]
        self.ntotal, self.dim = matrix.shape
        bounds = np.linspace(0, self.ntotal, len(devices) + 1).astype(int)
        self._shards = []
        for device, start, stop in zip(devices, bounds[:-1], bounds[1:], strict=True):
            dtype = torch.float16 if device.type == "cuda" else torch.float32
            shard = torch.from_numpy(np.array(matrix[start:stop], dtype=np.float32))  # a copy: off disk
            self._shards.append((int(start), shard.to(device=device, dtype=dtype)))

    @torch.inference_mode()
    def search(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        query = torch.from_numpy(np.ascontiguousarray(vectors, dtype=np.float32))
        all_scores, all_rows = [], []
        for start, shard in self._shards:
            scores = query.to(device=shard.device, dtype=shard.dtype) @ shard.T
            top = torch.topk(scores.float(), min(k, shard.shape[0]), dim=1)
            all_scores.append(top.values.cpu())
            all_rows.append(top.indices.cpu() + start)
        scores, rows = torch.cat(all_scores, dim=1), torch.cat(all_rows, dim=1)
        top = torch.topk(scores, min(k, scores.shape[1]), dim=1)
        rows = torch.gather(rows, 1, top.indices)
        return _pad(rows.numpy().astype(np.int64), top.values.numpy(), k)


def _pad(rows: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Pad result matrices to k columns with row -1 (no passage)."""
    missing = k - rows.shape[1]
    if missing <= 0:
        return rows, scores
    pad = ((0, 0), (0, missing))
    return np.pad(rows, pad, constant_values=-1), np.pad(scores, pad)
