"""Text encoders for dense retrieval, with each model family's conventions.

- e5 (`intfloat/e5-*`): `query: ` / `passage: ` prefixes, mean pooling, L2 normalisation.
- bge (`BAAI/bge-*`): CLS pooling, normalisation, an instruction before queries only.
- sentence-transformers models (a `modules.json` beside the weights): pooling, normalisation,
  maximum length and prompts as their config files say.
Anything else: mean pooling and normalisation. Batches are formed from texts of the same padded
length (few pad tokens, vectors independent of the batch), run under `torch.inference_mode`, fp16
on GPU; on CPU traced to TorchScript, or int8 (`quantize.py`) compiled, several times fp32's speed
where the CPU multiplies int8 in oneDNN and the index's build found it keeps recall (see
`forward_fn`, `dense_searcher.choose_quantize`): ahead of time by the build where it could
(`precompiled.py`, loaded by `Encoder.precompiled` without transformers), else at load.
"""

from __future__ import annotations

import itertools
import json
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from retriever_server.options import Quantize
from retriever_server.quantize import quantize_int8

BGE_QUERY_INSTRUCTION = "Represent this sentence for searching relevant passages: "
PAD_MULTIPLE = 8  # texts are padded to a multiple of this many tokens (see Encoder._encode)
RUNNERS = ("compiled", "traced", "eager")  # how a model runs, fastest first (see forward_fn)
# inductor's options for the int8 encoder, compiled at load or ahead of time (see `_compile`)
INDUCTOR_OPTIONS = {"realize_cpu_opcount_threshold": 20, "cpp.threads": 1}


@dataclass(frozen=True)
class EncoderSpec:
    """How to turn text into a vector with one model; stored in the index's meta.json."""

    model: str
    pooling: str = "mean"  # "mean" or "cls"
    normalize: bool = True
    query_prefix: str = ""
    passage_prefix: str = ""
    max_length: int = 512

    def to_json(self) -> dict:
        return asdict(self)


def _read_json(model_dir: Path, name: str) -> dict | list | None:
    path = model_dir / name
    return json.loads(path.read_text()) if path.is_file() else None


def _sentence_transformers_spec(model: str, model_dir: Path) -> EncoderSpec | None:
    modules = _read_json(model_dir, "modules.json")
    if not isinstance(modules, list):
        return None
    pooling = "mean"
    for module in modules:
        if module.get("type", "").endswith("Pooling"):
            config = _read_json(model_dir / module.get("path", ""), "config.json") or {}
            pooling = "cls" if config.get("pooling_mode_cls_token") else "mean"
    normalize = any(module.get("type", "").endswith("Normalize") for module in modules)
    bert_config = _read_json(model_dir, "sentence_bert_config.json") or {}
    prompts = (_read_json(model_dir, "config_sentence_transformers.json") or {}).get("prompts") or {}
    return EncoderSpec(
        model=model,
        pooling=pooling,
        normalize=normalize,
        query_prefix=prompts.get("query", ""),
        passage_prefix=prompts.get("passage", prompts.get("document", "")),
        max_length=int(bert_config.get("max_seq_length", 512)),
    )


def resolve_spec(model: str, family: str = "auto") -> EncoderSpec:
    """The conventions of `model` (a local directory or a hub name); `family` overrides detection."""
    name = model.lower().rstrip("/").rsplit("/", 1)[-1]
    if family == "auto":
        family = "e5" if "e5" in name else "bge" if "bge" in name else "st"
    if family == "e5":
        return EncoderSpec(model, "mean", True, "query: ", "passage: ", 512)
    if family == "bge":
        return EncoderSpec(model, "cls", True, BGE_QUERY_INSTRUCTION, "", 512)
    if family == "st":
        return _sentence_transformers_spec(model, Path(model)) or EncoderSpec(model)
    raise ValueError(f"family: expected auto, e5, bge or st, got {family!r}")


class Encoder:
    """A loaded transformer that embeds queries and passages as `EncoderSpec` prescribes."""

    def __init__(
        self,
        spec: EncoderSpec,
        *,
        device: str | None = None,
        quantize: Quantize | str | None = None,
        runner: str | None = None,
    ):
        """`runner` (one of `RUNNERS`): how the model runs; by default the fastest for the device and
        quantisation (on GPU eager; on CPU compiled int8, traced fp32)."""
        from transformers import AutoModel, AutoTokenizer

        self.spec = spec
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if quantize is not None and quantize not in list(Quantize):
            raise ValueError(f"quantize: expected one of {[q.value for q in Quantize]}, got {quantize!r}")
        if quantize == Quantize.INT8 and self.device.type != "cpu":
            raise ValueError("quantize: int8 runs on CPU only (the GPU encoder runs in fp16); use --quantize none")
        tokenizer = AutoTokenizer.from_pretrained(spec.model)
        self.input_names = [name for name in tokenizer.model_input_names if name in tokenizer(["probe"])]
        self.padding = Padding.of(tokenizer, self.input_names)
        self.tokenizer = tokenizer
        self.tokenize = lambda texts, max_length: {
            name: ids
            for name, ids in tokenizer(texts, truncation=True, max_length=max_length).items()
            if name in self.input_names
        }
        # transformers 5 loads a checkpoint in its stored dtype: a half-precision one would run so on CPU
        dtype = torch.float16 if self.device.type == "cuda" else torch.float32
        model = AutoModel.from_pretrained(spec.model, dtype=dtype).eval()
        if quantize == Quantize.INT8:
            model = quantize_int8(model)
        self.model = model.to(self.device)
        self.dim = int(model.config.hidden_size)
        if runner is None:
            runner = "eager" if self.device.type != "cpu" else "compiled" if quantize == Quantize.INT8 else "traced"
        self._forward, self.runner = forward_fn(self.model, tokenizer, runner=runner)

    @classmethod
    def precompiled(cls, spec: EncoderSpec, model: Callable[..., torch.Tensor], tokenizer, stored: dict) -> Encoder:
        """The int8 query encoder an index's build compiled ahead of time (`precompiled.py`): `model`
        the loaded package, `tokenizer` a `tokenizers.Tokenizer`; neither transformers nor the
        checkpoint is loaded. Runs on CPU."""
        self = cls.__new__(cls)
        self.spec, self.device, self.dim, self.runner = spec, torch.device("cpu"), int(stored["dim"]), "precompiled"
        self.input_names, self.padding = stored["inputs"], Padding(**stored["padding"])
        fields = {"input_ids": "ids", "token_type_ids": "type_ids", "attention_mask": "attention_mask"}
        tokenizer.no_padding()

        def tokenize(texts: list[str], max_length: int) -> dict[str, list[list[int]]]:
            tokenizer.enable_truncation(max_length, direction=stored["truncation_side"])
            encodings = tokenizer.encode_batch(texts)
            return {name: [getattr(encoding, fields[name]) for encoding in encodings] for name in self.input_names}

        self.tokenize = tokenize
        self._forward = lambda inputs: model(*(inputs[name] for name in self.input_names))
        return self

    def encode_queries(self, queries: list[str], batch_size: int = 64) -> np.ndarray:
        return self._encode([self.spec.query_prefix + q for q in queries], batch_size, self.spec.max_length)

    def encode_passages(self, passages: list[str], batch_size: int = 64) -> np.ndarray:
        return self._encode([self.spec.passage_prefix + p for p in passages], batch_size, self.spec.max_length)

    def _encode(self, texts: list[str], batch_size: int, max_length: int) -> np.ndarray:
        """Float32 [len(texts), dim], in input order. Each text is padded to the next multiple of
        `PAD_MULTIPLE` tokens and batched only with texts padded alike, so its vector does not depend
        on its batch (bitwise, even int8) and few pad tokens are computed."""
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        tokens = self.tokenize(texts, max_length)
        padded = [-(-len(ids) // PAD_MULTIPLE) for ids in tokens["input_ids"]]
        order = sorted(range(len(texts)), key=padded.__getitem__)
        for _, same in itertools.groupby(order, key=padded.__getitem__):
            same = list(same)
            for start in range(0, len(same), batch_size):
                chunk = same[start : start + batch_size]
                out[chunk] = self._embed_batch({key: [values[i] for i in chunk] for key, values in tokens.items()})
        return out

    @torch.inference_mode()
    def _embed_batch(self, tokens: dict[str, list[list[int]]]) -> np.ndarray:
        inputs = {key: value.to(self.device) for key, value in self.padding(tokens).items()}
        hidden = self._forward(inputs)
        if self.spec.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
        pooled = pooled.float()
        if self.spec.normalize:
            pooled = torch.nn.functional.normalize(pooled, dim=-1)
        return pooled.cpu().numpy()


@dataclass(frozen=True)
class Padding:
    """How a batch's token lists are padded, to the next multiple of `PAD_MULTIPLE` tokens: each
    input's pad value and the side, as transformers' `tokenizer.pad` pads them, by hand so that a
    server loading a precompiled encoder needs no transformers (stored in the index's meta)."""

    values: dict[str, int]
    side: str = "right"

    @classmethod
    def of(cls, tokenizer, names: list[str]) -> Padding:
        fill = {"input_ids": tokenizer.pad_token_id, "token_type_ids": tokenizer.pad_token_type_id}
        return cls({name: int(fill.get(name) or 0) for name in names}, tokenizer.padding_side)

    def __call__(self, tokens: dict[str, list[list[int]]]) -> dict[str, torch.Tensor]:
        length = -(-max(map(len, tokens["input_ids"])) // PAD_MULTIPLE) * PAD_MULTIPLE
        padded = {}
        for name, rows in tokens.items():
            array = np.full((len(rows), length), self.values[name], dtype=np.int64)
            for i, row in enumerate(rows):
                if self.side == "right":
                    array[i, : len(row)] = row
                else:
                    array[i, length - len(row) :] = row
            padded[name] = torch.from_numpy(array)
        return padded


class LastHiddenState(torch.nn.Module):
    """A model as a function of its input tensors in a fixed order, as tracing needs."""

    def __init__(self, model: torch.nn.Module, names: list[str]):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        return self.model(**dict(zip(self.names, tensors, strict=True))).last_hidden_state


def forward_fn(model: torch.nn.Module, tokenizer, *, runner: str) -> tuple[Callable[[dict], torch.Tensor], str]:
    """(tokenizer output -> last hidden state, the runner it uses): `runner` where it works, else the
    next of `RUNNERS` ("compiled" -> "traced" -> "eager"), each checked against the eager model on
    batches of other shapes than the one it was built on.

    - compiled: `torch.compile` (inductor's C++ kernels) fuses the work between the int8 products
      (quantising each row, dequantising, bias, GELU, layer norm, softmax) that the other runners do
      op by op, each a pass over memory. It compiles here, at load, never on a request (see
      `_compile`). Its Python wrapper returns to the GIL between kernels: the server runs it in a
      process of its own.
    - traced: TorchScript. A forward pass takes Python's GIL once, not once per op, so a busy event
      loop beside it slows it far less than the eager model.
    """
    if runner not in RUNNERS:
        raise ValueError(f"runner: expected one of {RUNNERS}, got {runner!r}")

    @torch.inference_mode()  # inference tensors, as `Encoder._embed_batch` makes (a compiled graph's guards tell)
    def batch(*texts: str) -> tuple[torch.Tensor, ...]:
        inputs = tokenizer(list(texts), return_tensors="pt", padding=True)
        return tuple(inputs[name] for name in names)

    def by_name(run: Callable[..., torch.Tensor]) -> Callable[[dict], torch.Tensor]:
        return lambda inputs: run(*(inputs[name] for name in names))

    names = [name for name in tokenizer.model_input_names if name in tokenizer(["probe"])]
    eager = LastHiddenState(model, names)
    checks = [batch("one"), batch("two texts", "of", "three")]
    if runner == "compiled":
        compiled = _compile(eager, [batch("retrieval")], checks)
        if compiled is not None:
            return by_name(compiled), "compiled"
        runner = "traced"
    if runner == "traced":
        try:
            with torch.inference_mode(), warnings.catch_warnings():
                warnings.simplefilter("ignore", torch.jit.TracerWarning)
                graph = torch.jit.trace(eager, batch("retrieval", "a longer text, padded"), check_trace=False)
                same = all(torch.allclose(graph(*inputs), eager(*inputs), atol=1e-5) for inputs in checks)
        except Exception:  # a model tracing cannot follow: it runs eagerly
            same = False
        if same:
            return by_name(graph), "traced"
    return by_name(eager), "eager"


def _compile(eager: LastHiddenState, warm_up: list[tuple], checks: list[tuple]) -> Callable | None:
    """`eager` compiled by inductor and run once, or None if that fails or it disagrees with `eager`.

    One graph serves every batch (its batch size is an unbacked symbol: no recompile at 1) and every
    padded length (symbolic). Should a later batch still miss the graph's guards, it runs eagerly
    rather than compiling on a request. Attention runs as plain matmuls and softmax, which inductor
    fuses (faster here than SDPA's kernel on short queries), and values used twice are stored rather
    than recomputed (a lower `realize_cpu_opcount_threshold`: the GELU feeds both a row's int8 scale and
    its quantisation). The fused kernels run on one thread (the int8 products still use torch's
    threads): they are small, and an OpenMP region in each only adds threads waiting for each other.
    A compiled forward pass agrees with the eager one only up to int8 roundings that flip between
    fused and unfused arithmetic (a few percent per text, less than int8 against fp32 moves it), so
    the check allows 25% per text: enough to catch a wrong graph, which is far off.
    """
    config = getattr(eager.model, "config", None)
    attention = getattr(config, "_attn_implementation", None)  # a transformers model's; switched back on failure

    def call(*tensors: torch.Tensor) -> torch.Tensor:
        for tensor in tensors:
            torch._dynamo.decorators.mark_unbacked(tensor, 0)
        return compiled(*tensors)

    def forward(*tensors: torch.Tensor) -> torch.Tensor:
        with torch.compiler.set_stance("eager_on_recompile"):
            return call(*tensors)

    try:
        if attention is not None:
            eager.model.set_attn_implementation("eager")
        compiled = torch.compile(eager, dynamic=True, options=INDUCTOR_OPTIONS)
        with torch.inference_mode():
            for inputs in warm_up:
                call(*inputs)
            same = all(close_enough(forward(*inputs), eager(*inputs), rtol=0.25) for inputs in checks)
    except Exception as exc:  # e.g. no C++ compiler
        warnings.warn(f"torch.compile failed, falling back to TorchScript: {type(exc).__name__}: {exc}", stacklevel=3)
        same = False
    if same:
        return forward
    if attention is not None:
        eager.model.set_attn_implementation(attention)
    return None


def close_enough(value: torch.Tensor, reference: torch.Tensor, *, rtol: float) -> bool:
    """Each text's hidden states within `rtol` of the reference's, relative to their norm."""
    error = torch.linalg.vector_norm(value - reference, dim=(1, 2))
    return bool((error <= rtol * torch.linalg.vector_norm(reference, dim=(1, 2))).all())


def encode_corpus(
    encoder: Encoder,
    passages: Callable[[int, int], list[str]],
    count: int,
    out: np.ndarray,
    *,
    chunk: int = 1024,
    batch_size: int = 64,
    done: Callable[[int], None] = lambda passages: None,
) -> None:
    """Embed passages [0, count) into `out` (e.g. a memory-mapped .npy) chunk by chunk; `done(n)` is
    told each chunk's passages."""
    for start in range(0, count, chunk):
        stop = min(start + chunk, count)
        out[start:stop] = encoder.encode_passages(passages(start, stop), batch_size)
        done(stop - start)
