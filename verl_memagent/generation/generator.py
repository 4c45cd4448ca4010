"""Token-in/token-out generation with transformers, batching concurrent requests: the `hf` rollout engine.

verl's agent loops talk to an inference server through one call,
`generate(request_id, prompt_ids=..., sampling_params=...) -> TokenOutput`. vLLM answers it on a GPU;
`HFGenerator` answers it anywhere transformers runs, with vLLM's semantics:

- sampling params as verl's agent loops pass them (`AgentLoopWorker.generate_sequences`, vLLM's
  `SamplingParams` names): `temperature` (0 = greedy), `top_p`, `top_k` (-1 or 0 = off),
  `repetition_penalty`, `logprobs` (bool), `max_tokens`/`max_new_tokens`, `stop` (strings),
  `stop_token_ids`, `ignore_eos`, `seed`; an unknown key is an error, never silently ignored;
- `log_probs` are vLLM's `processed_logprobs` (verl's default `rollout.logprobs_mode`): the log-softmax
  of the logits after repetition penalty, temperature, top-k and top-p, taken at the sampled token;
  greedy rows get the plain log-softmax. With top-k/top-p off this is exactly what verl's actor
  computes, `log_softmax(logits / temperature)`, so rollout and trainer log-probs are comparable;
- returned token ids end with the token that stopped generation (EOS, a stop token, or the token that
  completed a stop string), as vLLM's `token_ids` do: the agent loop trains on exactly these ids.

Concurrent `generate` calls decode together with continuous batching (`decoding.RunningBatch`): a
request arriving while others decode is prefilled and joins them at the next step, a row that stops
leaves at once. Each step runs in a worker thread so the event loop keeps serving.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from verl.workers.rollout.replica import TokenOutput

from verl_memagent.generation.decoding import ATTENTION, RunningBatch, register_attention
from verl_memagent.generation.prefix_cache import PrefixCache
from verl_memagent.generation.requests import Request
from verl_memagent.generation.sampling import BatchSampler


class HFGenerator:
    """Serve verl's token-in/token-out `generate` from a transformers causal LM, batching concurrent calls.

    Args:
        model: a causal LM (`AutoModelForCausalLM`); it is put in eval mode and used on its own device.
        tokenizer: decodes generated tokens to match `stop` strings.
        eos_token_ids: tokens that end generation unless a request sets `ignore_eos`.
        max_model_len: prompt plus response may not exceed this.
        default_max_tokens: used when a request names no `max_tokens` (verl: `rollout.response_length`).
        max_batch_size: at most this many requests decode together.
        batch_wait_s: after the first request of a batch arrives, wait this long for others to join.
        prefix_cache_bytes: keys and values of finished sequences kept for prompts that repeat them
            (`prefix_cache`); 0 keeps none.
        seed: seeds sampling for requests that bring no `seed` of their own.
    """

    def __init__(
        self,
        model,
        tokenizer,
        *,
        eos_token_ids: Iterable[int],
        max_model_len: int,
        default_max_tokens: int,
        max_batch_size: int = 64,
        batch_wait_s: float = 0.005,
        seed: int = 0,
        prefix_cache_bytes: int = 1 << 30,
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.eos_token_ids = set(eos_token_ids)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_token_ids)
        self.max_model_len = max_model_len
        self.default_max_tokens = default_max_tokens
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.prefixes = PrefixCache(prefix_cache_bytes)
        self.global_steps: int | None = None
        self._sampling_generator = torch.Generator().manual_seed(seed)
        self._model_lock = threading.Lock()
        # weight loads wait until no row is decoding, and no row starts while one waits
        self._decoding_state = threading.Condition()
        self._decoding = False
        self._loads_waiting = 0
        self._queue: asyncio.Queue[Request] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._worker: asyncio.Task | None = None

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        max_model_len: int,
        default_max_tokens: int,
        dtype: torch.dtype = torch.float32,
        trust_remote_code: bool = False,
        **kwargs: Any,
    ) -> HFGenerator:
        """Load model and tokenizer from a local directory; EOS ids from the generation config and tokenizer.
        Without transformers' progress bar per loaded tensor: the consoles that load this (eval, the `hf`
        rollout server) show their own progress."""
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as transformers_logging

        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        bar_was_on = transformers_logging.is_progress_bar_enabled()
        transformers_logging.disable_progress_bar()
        try:
            register_attention()
            model = AutoModelForCausalLM.from_pretrained(
                path, dtype=dtype, attn_implementation=ATTENTION, trust_remote_code=trust_remote_code
            )
        finally:
            if bar_was_on:
                transformers_logging.enable_progress_bar()
        eos = model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        if tokenizer.eos_token_id is not None:
            eos_ids.add(tokenizer.eos_token_id)
        return cls(
            model,
            tokenizer,
            eos_token_ids=eos_ids,
            max_model_len=max_model_len,
            default_max_tokens=default_max_tokens,
            **kwargs,
        )

    # ----------------------------------------------------------------------------------------- weights
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], global_steps: int | None = None) -> int:
        """Copy full tensors (HF parameter names, e.g. from FSDP's `get_per_tensor_param`) into the model.

        Waits until no row is decoding (requests arriving meanwhile wait for the new weights). Returns how
        many tensors were loaded; an unknown name or a shape mismatch raises instead of being skipped.
        """
        params = dict(self.model.named_parameters(remove_duplicate=False))  # tied weights under both names
        params.update(self.model.named_buffers(remove_duplicate=False))
        loaded = 0
        with self._decoding_state:
            self._loads_waiting += 1
            try:
                self._decoding_state.wait_for(lambda: not self._decoding)
                loaded = self._copy_weights(weights, params)
                self.prefixes.clear()  # keys and values of the old weights
            finally:
                self._loads_waiting -= 1
                self._decoding_state.notify_all()
        if global_steps is not None:
            self.global_steps = global_steps
        return loaded

    def _copy_weights(self, weights: Iterable[tuple[str, torch.Tensor]], params: dict) -> int:
        loaded = 0
        with self._model_lock, torch.no_grad():
            for name, tensor in weights:
                if name not in params:
                    raise KeyError(f"load_weights: {name!r} is not a parameter of {type(self.model).__name__}")
                target = params[name]
                if target.shape != tensor.shape:
                    raise ValueError(
                        f"load_weights: {name!r} has shape {tuple(tensor.shape)}, expected {tuple(target.shape)}"
                    )
                target.copy_(tensor.to(device=target.device, dtype=target.dtype))
                loaded += 1
        return loaded

    # -------------------------------------------------------------------------------------- generation
    async def generate(
        self, request_id: str, *, prompt_ids: Sequence[int], sampling_params: dict[str, Any], **kwargs: Any
    ) -> TokenOutput:
        """Generate one response; concurrent calls are decoded together. Multimodal inputs are refused."""
        media = {k: v for k, v in kwargs.items() if k.endswith("_data") and v is not None}
        if media:
            raise ValueError(f"hf rollout generates text only; got {sorted(media)} for request {request_id}")
        self._ensure_worker()
        request = Request.of(
            list(prompt_ids), dict(sampling_params), self.max_model_len, self.default_max_tokens, self.eos_token_ids
        )
        await self._queue.put(request)
        await request.future
        return TokenOutput(
            token_ids=request.token_ids,
            log_probs=request.log_probs if request.want_logprobs else None,
            stop_reason="completed",
            extra_fields={"finish_reason": request.finish_reason, "global_steps": self.global_steps},
        )

    def _ensure_worker(self) -> None:
        """Start the batching task in the running loop (again, if a previous loop has gone)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._worker is None or self._worker.done():
            self._loop = loop
            self._queue = asyncio.Queue()
            self._worker = loop.create_task(self._serve(self._queue))

    async def _serve(self, queue: asyncio.Queue[Request]) -> None:
        batch: RunningBatch | None = None
        waiting: list[Request] = []
        while True:
            if batch is None and not waiting:
                waiting.append(await queue.get())
                await asyncio.sleep(self.batch_wait_s)  # let the others of a burst arrive
            room = self.max_batch_size - len(waiting) - (len(batch) if batch else 0)
            while room > 0 and not queue.empty():
                waiting.append(queue.get_nowait())
                room -= 1
            # while a weight load waits, the running rows finish and no new row starts
            joining, waiting = ([], waiting) if self._loads_waiting and batch else (waiting, [])
            try:
                batch, finished = await asyncio.to_thread(self._advance, batch, joining)
            except Exception as e:  # every caller of the batch sees the error, the server keeps serving
                finished, batch = (batch.requests if batch else []) + joining, None
                self._set_decoding(False)
                for request in finished:
                    if not request.future.done():
                        request.future.set_exception(e)
                continue
            for request in finished:
                if not request.future.done():
                    request.future.set_result(None)

    def _set_decoding(self, decoding: bool) -> None:
        with self._decoding_state:
            if decoding:
                self._decoding_state.wait_for(lambda: not self._loads_waiting)
            self._decoding = decoding
            self._decoding_state.notify_all()

    @torch.inference_mode()
    def _advance(self, batch: RunningBatch | None, joining: list[Request]) -> tuple[RunningBatch | None, list[Request]]:
        """One step: the running rows decode a token, the joining requests are prefilled (their first token)
        and join them; returns the rows still decoding and the requests that finished."""
        if batch is None:
            self._set_decoding(True)
        with self._model_lock:
            if batch is not None:
                self._sample(batch, batch.step(self.model))
            if joining:
                new, logits = RunningBatch.prefill(self.model, joining, self.pad_token_id, self.prefixes)
                self._sample(new, logits)
                batch = new if batch is None else batch.join(new)
            batch, finished = batch.without_finished(self.prefixes)
        if batch is None:
            self._set_decoding(False)
        return batch, finished

    def _sample(self, batch: RunningBatch, logits: torch.Tensor) -> None:
        tokens, log_probs = BatchSampler(batch.requests, logits.device).sample(
            logits, batch.seen, self._sampling_generator
        )
        batch.record(tokens)
        for request, token, log_prob in zip(batch.requests, tokens.tolist(), log_probs.tolist(), strict=True):
            request.append(token, log_prob, self.tokenizer)
