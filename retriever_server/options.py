"""Build and serve options, shared by the CLI, the index and each kind's searcher. Plain data with
no heavy import: a BM25 server reads them without loading torch or faiss."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

QUANTIZE_CHOICES = ("none", "int8")  # how a CPU server runs the query encoder: fp32, or int8 (quantize.py)


@dataclass
class DenseOptions:
    """Build options of `--kind dense`."""

    encoder: str
    family: str = "auto"
    index_type: str = "flat"
    prebuilt_faiss: Path | None = None
    batch_size: int = 64
    device: str | None = None
    query_quantize: str = "int8"  # how a CPU server runs the query encoder (meta `query_quantize`)


@dataclass
class LoadOptions:
    """Serve-time options: where to run the encoder and how hard approximate indexes search."""

    device: str | None = None
    quantize: str | None = None  # None: as the index's meta says ("none" for indexes built before it did)
    query_batch_size: int | None = None  # None: 64 on CPU (fastest per query there), 256 on GPU
    nprobe: int = 32
    ef_search: int = 128
    threads: int = 1  # per search process: torch, BLAS, faiss, numba and Lucene threads
    bm25_backend: str = "auto"


def default_threads(search_processes: int) -> int:
    """Threads per search process unless `--threads` says otherwise: the cores this process may use,
    less one for the HTTP side (and clients on the same machine), divided among the search processes.
    A thread pool that asks for every core waits at each op for whichever of its threads another
    process has preempted, so it must not count on the cores the HTTP side is using."""
    return max(1, (len(os.sched_getaffinity(0)) - 1) // search_processes)


@dataclass(frozen=True)
class ServerLimits:
    """What `serve` accepts (each field is the option of the same name). The defaults are the original
    servers' (Search-R1's topk 3, MemSearcher's top_n 10); the limits sit far above any paper's
    batch (Search-R1 sends 512 x 5 = 2,560 queries in one request) and only bound what a broken or
    hostile client can cost. `topk_max` is also the depth every query is searched to."""

    topk_default: int = 3
    top_n_default: int = 10
    topk_max: int = 50
    max_queries: int = 65_536  # per request
    max_query_chars: int = 8_192  # a longer query is cut to this many characters, not refused
    max_body_bytes: int = 32 * 1024 * 1024  # 16,384 queries of 2,000 characters (parsed on the loop: ~10 ms/MB)
    max_header_bytes: int = 64 * 1024  # request line and header fields together
    max_headers: int = 100
    header_timeout_s: float = 10.0  # for the whole head, from the connection or the request's first byte
    body_timeout_s: float = 30.0  # without a byte while a body is read
    keep_alive_s: float = 5.0  # an idle connection between requests is closed after this (uvicorn's default)
    token: str | None = None

    def __post_init__(self):
        for name, value in vars(self).items():
            if name != "token" and not value > 0:
                raise ValueError(f"--{name.replace('_', '-')}: expected a positive number, got {value}")
