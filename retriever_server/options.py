"""Build and serve options, shared by the CLI, the index and each kind's searcher. Plain data with
no heavy import: a BM25 server reads them without loading torch or faiss."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from enum import Enum
from pathlib import Path


class Quantize(str, Enum):
    """How a CPU server runs the query encoder: `none` (fp32) or `int8` (quantize.py). The values of
    `--quantize`, `--query-quantize` and the index meta's `query_quantize`."""

    NONE = "none"
    INT8 = "int8"

    def __str__(self) -> str:
        return self.value


@dataclass
class DenseOptions:
    """Build options of `--kind dense`."""

    encoder: str
    family: str = "auto"
    index_type: str = "flat"
    prebuilt_faiss: Path | None = None
    batch_size: int = 64
    device: str | None = None
    query_quantize: Quantize = Quantize.INT8  # how a CPU server runs the query encoder (meta `query_quantize`)


@dataclass
class LoadOptions:
    """Serve-time options: where to run the encoder and how hard approximate indexes search."""

    device: str | None = None
    quantize: Quantize | None = None  # None: as the index's meta says (none for indexes built before it did)
    query_batch_size: int | None = None  # None: 64 on CPU (fastest per query there), 256 on GPU
    nprobe: int = 32
    ef_search: int = 128
    threads: int = 1  # per search process: torch, BLAS, faiss, numba and Lucene threads
    lone_threads: int | None = None  # dense: most encoder threads for a lone batch on idle cores (None: threads)
    bm25_backend: str = "auto"


def default_threads(search_processes: int) -> int:
    """Threads per search process unless `--threads` says otherwise: the cores this process may use,
    less one for the HTTP side (and clients on the same machine), divided among the search processes.
    A thread pool that asks for every core waits at each op for whichever of its threads another
    process has preempted, so it must not count on the cores the HTTP side is using."""
    return max(1, (len(os.sched_getaffinity(0)) - 1) // search_processes)


def _limit(default: int | float, help: str):
    """A `ServerLimits` field; `serve` makes it the option `--<name>` with this help."""
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class ServerLimits:
    """What `serve` accepts (each field but `token` is the option of the same name: `limit_options`).
    The defaults are the original servers' (Search-R1's topk 3, MemSearcher's top_n 10); the limits
    sit far above any paper's batch (Search-R1 sends 512 x 5 = 2,560 queries in one request) and only
    bound what a broken or hostile client can cost. `topk_max` is also the depth every query is
    searched to."""

    topk_default: int = _limit(3, "/retrieve's topk if none is given (Search-R1's)")
    top_n_default: int = _limit(10, "/search's top_n when none is given (MemSearcher's)")
    topk_max: int = _limit(50, "largest topk accepted; every query is searched to it")
    max_queries: int = _limit(65_536, "queries per request (422 beyond)")
    max_query_chars: int = _limit(8_192, "a longer query is cut to this many characters (not refused)")
    # 16,384 queries of 2,000 characters (a body is parsed on the event loop: about 10 ms a MB)
    max_body_bytes: int = _limit(32 * 1024 * 1024, "request body (413 beyond)")
    max_header_bytes: int = _limit(64 * 1024, "request line and header fields together (431 beyond)")
    max_headers: int = _limit(100, "header fields (431 beyond)")
    header_timeout_s: float = _limit(10.0, "a request head must be complete within this (408 and closed)")
    body_timeout_s: float = _limit(30.0, "longest wait for the next byte of a body (408 and closed)")
    keep_alive_s: float = _limit(5.0, "an idle connection between requests is closed after this (uvicorn's default)")
    token: str | None = None

    def __post_init__(self):
        for name, value in vars(self).items():
            if name != "token" and not value > 0:
                raise ValueError(f"--{name.replace('_', '-')}: expected a positive number, got {value}")


def limit_options(parser) -> None:
    """Add each `ServerLimits` field as `--<name>` (its type, default and help) to an argparse parser."""
    for limit in fields(ServerLimits):
        if limit.name != "token":
            flag = f"--{limit.name.replace('_', '-')}"
            parser.add_argument(flag, type=type(limit.default), default=limit.default, help=limit.metadata["help"])
