"""The CPU int8 query encoder compiled ahead of time by the index's build, and loaded by its servers.

Compiled at load (`torch.compile`), the int8 encoder cost every search process 16-23 s of start-up,
and again after each restart: 70% of a dense server's start (issue #37). It runs twice the queries/s
of the eager int8 model, so it stays; the work moves to the build. The build exports the model
(`torch.export`, batch size and padded length symbolic) and compiles it with AOTInductor into one
package (the kernels and the int8 weights in a shared library), checked against the eager model on
batches of other shapes, and stores it in the index beside the tokenizer (a `tokenizers` file). A
search process loads both in about a second and imports neither transformers nor the checkpoint.

A package runs only where it was built for: the same torch, a CPU with every vector extension of the
build machine's (the kernels use them; the int8 weights' range follows VNNI), and the same int8 matrix
product (`quantize.int8_matmul`). Elsewhere, or for an index built before this, the server compiles at
load as before and its log says why. Where int8 is slower than fp32 (`quantize.int8_slow_here`) the
build compiles nothing and the server runs fp32.

Compiling takes 1-2 minutes on 2 cores, and the package depends only on the model's files, the encoder
settings, torch and the CPU: a build keeps each package in a cache (`RETRIEVER_COMPILE_CACHE`, default
~/.cache/retriever_server/query_encoders; `off` turns it off), and the next index of the same encoder on
the same machine takes it from there, checked against the eager model as a new package is.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from retriever_server.encoders import (
    INDUCTOR_OPTIONS,
    PAD_MULTIPLE,
    Encoder,
    EncoderSpec,
    LastHiddenState,
    close_enough,
)
from retriever_server.options import Quantize
from retriever_server.quantize import cpu_flags, int8_matmul

DIRECTORY = "query_encoder"  # in the index directory
PACKAGE_FILE, TOKENIZER_FILE = "int8.pt2", "tokenizer.json"
MAX_BATCH = 1 << 16  # the largest batch the package takes (the server's batches are 64 by default)
VECTOR_FLAG_PREFIXES = ("sse", "ssse", "avx", "amx", "fma", "f16c")


def cpu_vector_flags() -> list[str]:
    """The vector-extension flags of this CPU (from /proc/cpuinfo; none where it cannot be read)."""
    return sorted(flag for flag in set(cpu_flags()) if flag.startswith(VECTOR_FLAG_PREFIXES))


def machine() -> dict:
    """What a package depends on besides the model: torch's version, the CPU's vector extensions, and
    what multiplies int8 matrices here (`quantize.int8_matmul`): a package is compiled, cached and
    loaded only where int8 is the faster encoder."""
    return {"torch": torch.__version__, "cpu_flags": cpu_vector_flags(), "int8_matmul": int8_matmul()}


def compile_query_encoder(spec: EncoderSpec, index_dir: Path) -> dict:
    """Compile the int8 query encoder of `spec` into `index_dir`/query_encoder; the meta's entry: the
    files, what loading them needs, and the machine it was built on. Raises where the model cannot
    be exported or compiled, or its compiled form disagrees with the eager one."""
    out = Path(index_dir) / DIRECTORY
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    try:
        return _compile_into(spec, out)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise


def _compile_into(spec: EncoderSpec, out: Path) -> dict:
    encoder = Encoder(spec, device="cpu", quantize=Quantize.INT8, runner="eager")
    if not getattr(encoder.tokenizer, "is_fast", False):
        raise ValueError(f"{spec.model} has no fast tokenizer (a `tokenizers` file) to store")
    encoder.tokenizer.backend_tokenizer.save(str(out / TOKENIZER_FILE))
    if getattr(encoder.model.config, "_attn_implementation", None) is not None:
        encoder.model.set_attn_implementation("eager")  # plain matmuls and softmax, which inductor fuses
    eager = LastHiddenState(encoder.model, encoder.input_names).eval()

    def batch(*texts: str) -> tuple[torch.Tensor, ...]:
        padded = encoder.padding(encoder.tokenize(list(texts), spec.max_length))
        return tuple(padded[name] for name in encoder.input_names)

    longest = -(-spec.max_length // PAD_MULTIPLE) * PAD_MULTIPLE
    dims = {0: torch.export.Dim("batch", min=1, max=MAX_BATCH), 1: torch.export.Dim("length", min=1, max=longest)}

    def flaw(package: Path) -> str | None:
        """Why `package` cannot stand for the eager model, or None."""
        try:
            compiled = load_package(package)
        except RuntimeError as exc:  # not a package (damaged, half-written by hand, foreign)
            return f"does not load ({exc})"
        with torch.inference_mode():
            checks = (batch("one"), batch("two texts", "of", "three"), batch("a query " * 40))
            agrees = all(close_enough(compiled(*inputs), eager(*inputs), rtol=0.25) for inputs in checks)
        return None if agrees else "disagrees with the eager model"

    cached = cached_package(spec)
    found = cached is not None and cached.is_file()
    stale = flaw(cached) if found else None
    if found and stale is None:
        print(f"build: the int8 query encoder from the compile cache ({cached})")
        shutil.copyfile(cached, out / PACKAGE_FILE)
    else:
        if stale is not None:
            print(f"build: the compile cache's {cached} {stale}: compiling")
        with tempfile.TemporaryDirectory() as tmp:  # written whole, then moved: a half-written package never loads
            with torch.inference_mode():
                example = batch("retrieval", "a longer text, padded")
                exported = torch.export.export(eager, example, dynamic_shapes=(tuple(dims for _ in example),))
            package = Path(
                torch._inductor.aoti_compile_and_package(
                    exported,
                    package_path=str(Path(tmp) / PACKAGE_FILE),
                    # a copy: torch adds a key to the dict it is given, which would change the
                    # compile cache's key (`cached_package`) for the rest of the process
                    inductor_configs=dict(INDUCTOR_OPTIONS),
                )
            )
            reason = flaw(package)
            if reason is not None:
                raise ValueError(f"the compiled {spec.model} {reason}")
            if cached is not None:  # written whole, then renamed: a half-written package is never found
                cached.parent.mkdir(parents=True, exist_ok=True)
                partial = cached.with_name(f".{os.getpid()}.partial")
                shutil.copyfile(package, partial)
                os.replace(partial, cached)
            shutil.move(package, out / PACKAGE_FILE)
    return {
        "package": f"{DIRECTORY}/{PACKAGE_FILE}",
        "tokenizer": f"{DIRECTORY}/{TOKENIZER_FILE}",
        **model_inputs(encoder),
        "machine": machine(),
    }


def cached_package(spec: EncoderSpec) -> Path | None:
    """Where the compile cache keeps the package of `spec` for this machine; None when the cache is off or
    the model is not a local directory. The key hashes every file of the model, the encoder settings,
    the compile options and `machine()`."""
    setting = os.environ.get("RETRIEVER_COMPILE_CACHE", "")
    model_dir = Path(spec.model)
    if setting == "off" or not model_dir.is_dir():
        return None
    default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "retriever_server" / "query_encoders"
    key = hashlib.sha256(
        json.dumps([spec.to_json(), INDUCTOR_OPTIONS, MAX_BATCH, PAD_MULTIPLE, machine()], sort_keys=True).encode()
    )
    for path in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        key.update(f"{path.relative_to(model_dir)}\0{path.stat().st_size}\0".encode())
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                key.update(block)
    return (Path(setting) if setting else default) / key.hexdigest() / PACKAGE_FILE


def model_inputs(encoder: Encoder) -> dict:
    """What `Encoder.precompiled` needs to feed the model as `encoder` does, without transformers."""
    return {
        "dim": encoder.dim,
        "inputs": encoder.input_names,
        "padding": {"values": encoder.padding.values, "side": encoder.padding.side},
        "truncation_side": encoder.tokenizer.truncation_side,
    }


def unfit(stored: dict) -> str | None:
    """Why the package described by `stored` cannot run here, or None if it can."""
    built, here = stored["machine"], machine()
    if built["torch"] != here["torch"]:
        return f"it was compiled for torch {built['torch']}, this is torch {here['torch']}"
    missing = sorted(set(built["cpu_flags"]) - set(here["cpu_flags"]))
    if missing:
        return f"it was compiled for a CPU with {', '.join(missing)}, which this one lacks"
    product = built.get("int8_matmul", "onednn")  # packages from before this key: as oneDNN's
    if product != here["int8_matmul"]:
        return f"it was compiled where {product} multiplied int8 matrices, here {here['int8_matmul']} does"
    return None


def load_query_encoder(spec: EncoderSpec, index_dir: Path, stored: dict) -> Encoder:
    """The precompiled int8 query encoder of the index in `index_dir` (check `unfit` first)."""
    import tokenizers

    model = load_package(Path(index_dir) / stored["package"])
    tokenizer = tokenizers.Tokenizer.from_file(str(Path(index_dir) / stored["tokenizer"]))
    return Encoder.precompiled(spec, model, tokenizer, stored)


def load_package(path: Path | str):
    """The compiled model of an AOTInductor package, as a function of its input tensors. torch's own
    loader (`torch._inductor.aoti_load_package`) wraps the same C++ loader, but importing inductor
    and torch.export for it cost 5-10 s of a search process's start; the package's one model takes
    its inputs flat, in the order exported, and returns one tensor."""
    loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)
    return lambda *tensors: loader.run(list(tensors))[0]
