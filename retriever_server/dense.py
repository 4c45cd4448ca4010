"""Vector indexes over passage embeddings (inner product on normalised vectors = cosine).

- `flat`: faiss IndexFlatIP, exact; memory-mapped at load (Search-R1's `e5_Flat.index` loads as is).
- `hnsw`: faiss IndexHNSWFlat, approximate, fast on CPU.
- `ivfpq`: faiss IndexIVFPQ, approximate, compressed for CPU memory.
- `torch`: the embedding matrix itself, searched by matrix product: fp16 and sharded over the visible
  GPUs when there are any (no faiss-gpu needed), fp32 on CPU. A server on the GPU searches a `flat`
  file's vectors the same way (`FaissVectors`), so a prebuilt e5_Flat.index needs no faiss-gpu either.
faiss is imported by the faiss kinds only: building or serving a `torch` index does not need it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from retriever_server.results import pad

GPU_HEADROOM_BYTES = 2 << 30  # left free beside each GPU shard: a block of scores, top-k, the encoder
FAISS_KINDS = ("flat", "hnsw", "ivfpq")
INDEX_KINDS = (*FAISS_KINDS, "torch")
FAISS_FILE = "faiss.index"
EMBEDDINGS_FILE = "embeddings.npy"


def build_faiss(
    embeddings: np.ndarray, kind: str, path: Path, *, chunk: int = 65536, done: Callable[[int], None] = lambda n: None
):
    """Build a faiss index of `kind` from float32 [n, d] embeddings and write it to `path`; `done(n)`
    is told the vectors added, chunk by chunk."""
    import faiss

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
    for start in range(0, n, chunk):
        index.add(np.ascontiguousarray(embeddings[start : start + chunk]))
        done(min(chunk, n - start))
    faiss.write_index(index, str(path))


class FaissIndex:
    """A faiss index read from disk, memory-mapped where the index type allows it. A Flat index's vectors
    (and HNSW's) are mapped with `IO_FLAG_MMAP_IFC`: with `IO_FLAG_MMAP` alone faiss reads them into
    anonymous memory, a copy per search process (64.6 GB each for wiki-18 under e5), where a mapping is
    page cache that the processes share and the kernel can drop."""

    def __init__(self, path: Path, *, nprobe: int = 32, ef_search: int = 128):
        import faiss

        mapped = faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY
        for flags in (mapped | faiss.IO_FLAG_MMAP_IFC, mapped, 0):  # the IVF kinds refuse the first
            try:
                self._index = faiss.read_index(str(path), flags)
                break
            except RuntimeError:
                if not flags:
                    raise
        if hasattr(self._index, "nprobe"):
            self._index.nprobe = nprobe
        self._ef_search = ef_search if isinstance(self._index, faiss.IndexHNSW) else None
        self.ntotal, self.dim = int(self._index.ntotal), int(self._index.d)

    def search(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if self._ef_search is not None:
            self._index.hnsw.efSearch = max(self._ef_search, k)
        scores, rows = self._index.search(np.ascontiguousarray(vectors, dtype=np.float32), k)
        return rows.astype(np.int64), scores

    def vectors(self, rows: np.ndarray) -> np.ndarray:
        """The stored vectors of `rows`: flat and HNSW keep them; IVF-PQ keeps codes (RuntimeError)."""
        return self._index.reconstruct_batch(np.asarray(rows, dtype=np.int64))


class FaissVectors:
    """The vectors a faiss Flat (or HNSW) file stores, read by row range like an array: what a
    `TorchIndex` on the GPUs loads from a `flat` index."""

    def __init__(self, index: FaissIndex):
        self._index = index
        self.shape = (index.ntotal, index.dim)

    def __getitem__(self, rows: slice) -> np.ndarray:
        return self._index.vectors(np.arange(*rows.indices(self.shape[0])))


def fits_on_gpus(rows: int, dim: int, free_bytes: list[int]) -> bool:
    """Whether an fp16 [rows, dim] matrix split over GPUs with `free_bytes` free each leaves every one
    of them `GPU_HEADROOM_BYTES` to search with."""
    if not free_bytes:
        return False
    shard_bytes = -(-rows // len(free_bytes)) * dim * 2
    return all(free - shard_bytes >= GPU_HEADROOM_BYTES for free in free_bytes)


class TorchIndex:
    """Exact inner-product search by matrix product; rows sharded over the visible GPUs.

    `matrix` holds the [rows, dim] vectors and is read one row range at a time: a memory-mapped .npy
    (`np.load(path, mmap_mode="r")`) or a faiss file's (`FaissVectors`). Rows travel from it to their
    device `copy_rows` at a time (cast to fp16 there on GPU), so the host never holds a shard: 21M e5
    vectors are 64 GB in fp32 on disk, 32 GB on the GPU. A query batch is scored against at most
    `block_scores` / batch rows at once, keeping each block's top k, so the score matrix stays
    bounded however many rows a shard holds."""

    def __init__(
        self,
        matrix: np.ndarray | FaissVectors,
        *,
        devices: list[torch.device] | None = None,
        copy_rows: int = 1 << 18,
        block_scores: int = 1 << 27,
    ):
        if len(matrix.shape) != 2:
            raise ValueError(f"expected a 2-D embedding matrix, got shape {matrix.shape}")
        if devices is None:
            devices = [torch.device(f"cuda:{i}") for i in range(torch.cuda.device_count())] or [torch.device("cpu")]
        self.ntotal, self.dim = matrix.shape
        self._block_scores = block_scores
        bounds = np.linspace(0, self.ntotal, len(devices) + 1).astype(int)
        self._shards = []
        for device, start, stop in zip(devices, bounds[:-1], bounds[1:], strict=True):
            if stop == start:  # more devices than rows
                continue
            dtype = torch.float16 if device.type == "cuda" else torch.float32
            shard = torch.empty((stop - start, self.dim), dtype=dtype, device=device)
            for first in range(start, stop, copy_rows):
                last = min(first + copy_rows, stop)
                shard[first - start : last - start] = torch.from_numpy(np.array(matrix[first:last]))
            self._shards.append((int(start), shard))

    @property
    def devices(self) -> list[str]:
        return [str(shard.device) for _, shard in self._shards]

    @torch.inference_mode()
    def search(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        query = torch.from_numpy(np.ascontiguousarray(vectors, dtype=np.float32))
        block = max(1, self._block_scores // max(1, len(query)))
        per_shard = []
        for start, shard in self._shards:
            on_device = query.to(device=shard.device, dtype=shard.dtype)
            tops = []
            for first in range(0, shard.shape[0], block):
                scores = on_device @ shard[first : first + block].T
                values, rows = torch.topk(scores, min(k, scores.shape[1]), dim=1)
                tops.append((values, rows + (start + first)))
            values, rows = _top_k(tops, k)
            per_shard.append((values.float().cpu(), rows.cpu()))
        values, rows = _top_k(per_shard, k)
        return pad(rows.numpy().astype(np.int64), values.numpy(), k)


def _top_k(parts: list[tuple[torch.Tensor, torch.Tensor]], k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best (score, row) pairs per query over several blocks' own best."""
    values, rows = torch.cat([v for v, _ in parts], dim=1), torch.cat([r for _, r in parts], dim=1)
    values, best = torch.topk(values, min(k, values.shape[1]), dim=1)
    return values, torch.gather(rows, 1, best)
