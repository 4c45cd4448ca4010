"""Dense search: the query encoder in front of a vector index."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch

from retriever_server.dense import (
    EMBEDDINGS_FILE,
    FAISS_FILE,
    GPU_HEADROOM_BYTES,
    FaissIndex,
    FaissVectors,
    TorchIndex,
    fits_on_gpus,
)
from retriever_server.encoders import Encoder, EncoderSpec
from retriever_server.errors import IndexLoadError


class DenseSearcher:
    """Encodes queries (on `options.device`) and searches the vector index the meta names; on the
    GPUs, a `flat` index that fits their free memory is searched exactly by a `TorchIndex` over its
    vectors (no faiss-gpu), and a `torch` index that does not fit is a load error that says so.
    `searched_by` says what searches, and where."""

    def __init__(self, index_dir: Path, meta: dict, options, num_passages: int):
        on_gpu, kind = _on_gpu(options), meta["index_type"]
        devices = None if on_gpu else [torch.device("cpu")]  # None: every visible GPU
        shortfall = _gpu_shortfall(num_passages, meta["dim"]) if on_gpu and kind in ("torch", "flat") else None
        if kind == "torch":
            if shortfall:
                raise IndexLoadError(f"the torch index {shortfall}: make more GPUs visible or use --device cpu")
            self._index = TorchIndex(np.load(index_dir / EMBEDDINGS_FILE, mmap_mode="r"), devices=devices)
        elif kind == "flat" and on_gpu and not shortfall:
            self._index = TorchIndex(FaissVectors(FaissIndex(index_dir / FAISS_FILE)), devices=devices)
        else:
            if shortfall:  # a flat index too large for the GPUs
                warnings.warn(f"the flat index {shortfall}: faiss searches it on CPU", stacklevel=2)
            self._index = FaissIndex(index_dir / FAISS_FILE, nprobe=options.nprobe, ef_search=options.ef_search)
        if isinstance(self._index, TorchIndex):
            self.searched_by = "torch on " + ", ".join(self._index.devices)
        else:
            self.searched_by = "faiss on cpu"
        if self._index.ntotal != num_passages:
            raise ValueError(f"vector index holds {self._index.ntotal} vectors for {num_passages} passages")
        self._encoder = _query_encoder(index_dir, meta, _quantize(meta, options, on_gpu), options.device, on_gpu)
        if self._encoder.dim != self._index.dim:
            raise ValueError(f"encoder gives {self._encoder.dim}-d vectors, the index holds {self._index.dim}-d")
        self._batch_size = options.query_batch_size or (64 if self._encoder.device.type == "cpu" else 256)

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        return self._index.search(self._encoder.encode_queries(queries, self._batch_size), k)


def _query_encoder(index_dir: Path, meta: dict, quantize: str, device: str | None, on_gpu: bool) -> Encoder:
    """The int8 encoder the build compiled ahead of time where it runs here, else the model loaded
    (and on CPU compiled or traced) now."""
    spec = EncoderSpec(**meta["encoder"])
    stored = meta.get("precompiled")
    if quantize == "int8" and not on_gpu and stored is not None:
        from retriever_server.precompiled import load_query_encoder, unfit

        reason = unfit(stored)
        if reason is None:
            return load_query_encoder(spec, index_dir, stored)
        warnings.warn(f"the index's precompiled query encoder cannot run here ({reason}): compiling now", stacklevel=3)
    return Encoder(spec, device=device, quantize=quantize)


def _quantize(meta: dict, options, on_gpu: bool) -> str:
    """`--quantize` if given, else the index's `query_quantize` on CPU (passages are always fp32)."""
    if options.quantize is not None:
        return options.quantize
    return "none" if on_gpu else meta.get("query_quantize", "none")


def _gpu_shortfall(rows: int, dim: int) -> str | None:
    """None if an fp16 [rows, dim] matrix fits the visible GPUs beside what they already hold, else
    the sizes that say why not."""
    free = [torch.cuda.mem_get_info(i)[0] for i in range(torch.cuda.device_count())]
    if not free:
        return "needs a GPU, and none is visible"
    if fits_on_gpus(rows, dim, free):
        return None
    free_gb = [round(f / 1e9, 1) for f in free]
    return (
        f"({rows} x {dim}, {rows * dim * 2 / 1e9:.1f} GB in fp16) does not fit the free memory of the visible "
        f"GPUs ({free_gb} GB, {GPU_HEADROOM_BYTES >> 30} GiB kept free on each)"
    )


def _on_gpu(options) -> bool:
    """`--device`, or the GPU when there is one."""
    return (options.device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
