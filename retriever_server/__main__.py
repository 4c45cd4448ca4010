"""`python -m retriever_server build ...` and `python -m retriever_server serve ...`."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from dataclasses import fields
from pathlib import Path

from retriever_server.corpus import CorpusError
from retriever_server.errors import IndexLoadError
from retriever_server.index import KINDS
from retriever_server.options import (
    DenseOptions,
    LoadOptions,
    Quantize,
    ServerLimits,
    default_threads,
    limit_options,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m retriever_server", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    _build_options(commands.add_parser("build", help="build an index directory from a JSON-lines corpus"))
    _serve_options(commands.add_parser("serve", help="serve an index over HTTP"))
    return parser


def _build_options(build: argparse.ArgumentParser) -> None:
    build.add_argument("--kind", choices=KINDS, required=True)
    build.add_argument(
        "--corpus", type=Path, required=True, help='JSON lines {"id","contents"} or {"id","title","text"}'
    )
    build.add_argument("--out", type=Path, required=True, help="index directory to write")
    build.add_argument("--encoder", help="dense: model directory or hub name (e.g. intfloat/e5-base-v2)")
    build.add_argument("--family", default="auto", choices=("auto", "e5", "bge", "st"), help="dense: conventions")
    build.add_argument("--index-type", default="flat", help="dense: flat, hnsw, ivfpq (faiss) or torch (exact)")
    build.add_argument(
        "--prebuilt-faiss", type=Path, help="dense: an existing faiss index of this corpus (no encoding)"
    )
    build.add_argument(
        "--prebuilt-lucene", type=Path, help="pyserini: a Lucene index of this corpus built by pyserini's own indexer"
    )
    build.add_argument("--batch-size", type=int, default=64, help="dense: passages per encoder batch")
    build.add_argument("--device", help="dense: torch device for encoding (default: cuda if present)")
    build.add_argument(
        "--query-quantize",
        type=Quantize,
        default=Quantize.INT8,
        choices=list(Quantize),
        help="dense: query encoder of CPU servers (int8: several times fp32 on CPUs with AVX-512 VNNI, "
        "kept only where a check finds it keeps recall on this corpus; servers on other CPUs run fp32; "
        "passages are never quantised)",
    )
    build.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    build.add_argument(
        "--progress-every-s",
        type=float,
        default=10.0,
        help="seconds between progress lines when stderr is not a terminal",
    )


def _serve_options(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("--index", type=Path, required=True)
    serve.add_argument("--host", default="127.0.0.1", help="interface to bind (default loopback only)")
    serve.add_argument("--port", type=int, default=8000, help="0 picks a free port (see --port-file)")
    serve.add_argument("--port-file", type=Path, help="write the bound port to this file")
    limit_options(serve)
    serve.add_argument("--max-batch", type=int, default=256, help="queries per shared encoder/index batch")
    serve.add_argument("--max-wait-ms", type=float, default=0.0, help="wait for more queries before a batch")
    serve.add_argument("--cache-size", type=int, default=100_000, help="LRU entries (0 disables the cache)")
    serve.add_argument("--token-env", help="name of an environment variable holding a bearer token to require")
    serve.add_argument("--device", help="dense: torch device of the query encoder / torch index")
    serve.add_argument(
        "--quantize",
        type=Quantize,
        choices=list(Quantize),
        help="dense: CPU query encoder, int8 or none (fp32); default: as built",
    )
    serve.add_argument("--query-batch-size", type=int, help="dense: queries per forward pass (64 on CPU, 256 on GPU)")
    serve.add_argument("--nprobe", type=int, default=32, help="ivfpq: lists probed per query")
    serve.add_argument("--ef-search", type=int, default=128, help="hnsw: search breadth")
    serve.add_argument(
        "--bm25-backend",
        default="auto",
        choices=("auto", "numba", "numpy"),
        help="bm25 scoring: numba is much faster but compiles at start-up",
    )
    serve.add_argument(
        "--threads",
        type=int,
        help="threads per search process (torch, BLAS, faiss, numba, Lucene); default: the cores "
        "this process may use but one, divided among the search processes",
    )
    serve.add_argument(
        "--lone-threads",
        type=int,
        help="dense: most threads of a search process for a batch that is the server's only work, on cores "
        "that other processes left idle; default: as --threads (none lent: the gain is not measured yet)",
    )
    serve.add_argument(
        "--search-processes", type=int, default=1, help="searchers (encoder + index), each a process loading the index"
    )
    serve.add_argument(
        "--crash-window-s",
        type=float,
        default=10.0,
        help="a restarted search process that dies again within this stops the server",
    )
    serve.add_argument("--log-level", default="warning")


def _build(args: argparse.Namespace) -> int:
    dense = None
    if args.kind == "dense":
        if not args.encoder:
            raise ValueError("--kind dense needs --encoder (a local model directory or a hub name)")
        dense = DenseOptions(
            args.encoder,
            args.family,
            args.index_type,
            args.prebuilt_faiss,
            args.batch_size,
            args.device,
            args.query_quantize,
        )
    from retriever_server.index import build_index

    meta = build_index(
        args.kind,
        args.corpus,
        args.out,
        dense=dense,
        threads=args.threads,
        progress_every_s=args.progress_every_s,
        prebuilt_lucene=args.prebuilt_lucene,
    )
    if "int8_check" in meta.get("dense", {}):
        from retriever_server.int8_check import summary

        print(summary(meta["dense"]["int8_check"]))
    print(f"built {meta['kind']} index of {meta['num_passages']} passages in {args.out} ({meta['build_seconds']} s)")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from retriever_server.server import serve

    if args.search_processes < 1:
        raise ValueError(f"--search-processes: expected at least 1, got {args.search_processes}")
    for name in ("threads", "lone_threads"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}: expected at least 1, got {getattr(args, name)}")
    token = None
    if args.token_env:
        token = os.environ.get(args.token_env)
        if not token:
            raise ValueError(f"--token-env: environment variable {args.token_env} is unset or empty")
    # every limit but the token is the option of the same name
    limits = ServerLimits(
        **{f.name: getattr(args, f.name) for f in fields(ServerLimits) if f.name != "token"}, token=token
    )
    threads = args.threads or default_threads(args.search_processes)
    load = LoadOptions(
        args.device,
        args.quantize,
        args.query_batch_size,
        args.nprobe,
        args.ef_search,
        threads,
        args.lone_threads,
        args.bm25_backend,
    )
    return serve(
        args.index,
        host=args.host,
        port=args.port,
        limits=limits,
        load=load,
        max_batch=args.max_batch,
        max_wait_ms=args.max_wait_ms,
        cache_size=args.cache_size,
        port_file=args.port_file,
        log_level=args.log_level,
        search_processes=args.search_processes,
        crash_window_s=args.crash_window_s,
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _build(args) if args.command == "build" else _serve(args)
    except (CorpusError, IndexLoadError, ValueError, RuntimeError) as exc:
        print(f"retriever_server {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C (uvicorn raises it again once the server has shut down)
        _end_by(signal.SIGINT)


def _end_by(stop: signal.Signals) -> None:
    """End the process by `stop`, quietly: the exit status its caller expects of an interrupted
    command (a shell reads it as 130), where an uncaught KeyboardInterrupt prints a traceback first."""
    sys.stderr.flush()
    signal.signal(stop, signal.SIG_DFL)
    signal.raise_signal(stop)


if __name__ == "__main__":
    sys.exit(main())
