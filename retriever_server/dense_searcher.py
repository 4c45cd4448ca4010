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
from retriever_server.options import Quantize


class DenseSearcher:
    """Encodes queries (on `options.device`) and searches the vector index the meta names; on the
    GPUs, a `flat` index that fits their free memory is searched exactly by a `TorchIndex` over its
    vectors (no faiss-gpu), and a `torch` index that does not fit is a load error that says so.
    `searched_by` says what searches, and where; `query_encoder` the query encoder's precision and
    runner, and why they were chosen (the ready line and /health show both)."""

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
        quantize, why = choose_quantize(meta, options.quantize, on_gpu)
        self._encoder = _query_encoder(index_dir, meta, quantize, options.device, on_gpu)
        if self._encoder.dim != self._index.dim:
            raise ValueError(f"encoder gives {self._encoder.dim}-d vectors, the index holds {self._index.dim}-d")
        self._batch_size = options.query_batch_size or (64 if self._encoder.device.type == "cpu" else 256)
        precision = "fp16" if on_gpu else "int8" if quantize == Quantize.INT8 else "fp32"
        self.query_encoder = {"precision": precision, "runner": self._encoder.runner, "why": why}

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        return self._index.search(self._encoder.encode_queries(queries, self._batch_size), k)


def _query_encoder(index_dir: Path, meta: dict, quantize: Quantize, device: str | None, on_gpu: bool) -> Encoder:
    """The int8 encoder the build compiled ahead of time where it runs here, else the model loaded
    (and on CPU compiled or traced) now."""
    spec = EncoderSpec(**meta["encoder"])
    stored = meta.get("precompiled")
    if quantize == Quantize.INT8 and not on_gpu and stored is not None:
        from retriever_server.precompiled import load_query_encoder, unfit

        reason = unfit(stored)
        if reason is None:
            return load_query_encoder(spec, index_dir, stored)
        warnings.warn(f"the index's precompiled query encoder cannot run here ({reason}): compiling now", stacklevel=3)
    return Encoder(spec, device=device, quantize=quantize)


def choose_quantize(meta: dict, asked: str | None, on_gpu: bool) -> tuple[Quantize, str]:
    """The query encoder's quantisation on this machine, and why. `--quantize`
    (`asked`) rules; on GPU fp16; on CPU the index's `query_quantize` (int8 where its build found it
    keeps recall), except that int8 runs only where it is faster than fp32 (`quantize.int8_slow_here`):
    the serving CPU decides, whatever CPU built the index."""
    from retriever_server.quantize import int8_slow_here

    if asked is not None:
        asked = Quantize(asked)
        slow = int8_slow_here() if asked == Quantize.INT8 and not on_gpu else None
        if slow is not None:
            warnings.warn(f"--quantize int8 on a CPU where int8 is slower than fp32: {slow}", stacklevel=3)
        return asked, f"--quantize {asked}"  # int8 on a GPU is refused by the encoder
    if on_gpu:
        return Quantize.NONE, "on GPU: fp16"
    built = Quantize(meta.get("query_quantize", Quantize.NONE))
    if built != Quantize.INT8:
        lost = "int8_check" in meta  # the check ran and int8 lost recall
        return (
            Quantize.NONE,
            "the build's int8 check found int8 loses recall" if lost else f"built --query-quantize {built}",
        )
    slow = int8_slow_here()
    if slow is not None:
        return Quantize.NONE, f"int8 is slower than fp32 here: {slow}"
    return Quantize.INT8, "the build's int8 check kept recall, and this CPU runs int8 products in oneDNN (VNNI)"


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
