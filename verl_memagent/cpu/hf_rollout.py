"""The `hf` rollout backend: verl's rollout replica, server actor and weight-sync adapter around HFGenerator.

verl's V1 trainer talks to a rollout backend through three pieces (see vLLM's in
workers/rollout/vllm_rollout/): a `RolloutReplica` that launches server actors next to the training
workers, a server actor whose `generate` the agent loops call (llm_server.py `LLMServerClient`), and a
`BaseRollout` "server adapter" living in each training worker, through which the trainer's in-process
("naive") sync hands over full weights after every step (engine_workers.py `update_weights`).
Here the server is an `HFGenerator` on CPU; weights and cache live in host memory, so sleep and wake
have nothing to free. verl's colocated trainers run (`sync`, `colocate_async`: the async one pauses the
server around weight updates with `abort_all_requests` / `resume_generation`, which here drain running
requests instead of cutting them short, so the project's async trainers refuse this backend:
`algo.trainer.check_rollout_backend`); `separate_async` needs rollout replicas on GPUs of their own
(standalone mode), which this backend does not launch.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable
from typing import Any

import ray
import torch
from omegaconf import DictConfig
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from verl.utils.fs import copy_to_local
from verl.utils.torch_dtypes import PrecisionType
from verl.workers.config import RolloutConfig
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutMode, RolloutReplica, TokenOutput

from verl_memagent.generation.generator import HFGenerator

NAME = "hf"


def server_actor_name(replica_rank: int) -> str:
    """The Ray actor name of replica `replica_rank`'s server."""
    return f"{NAME}_server_{replica_rank}"


def _check_single_process(config: RolloutConfig) -> None:
    sizes = {
        "tensor_model_parallel_size": config.tensor_model_parallel_size,
        "data_parallel_size": config.data_parallel_size,
        "pipeline_model_parallel_size": config.pipeline_model_parallel_size,
    }
    wrong = {k: v for k, v in sizes.items() if v != 1}
    if wrong:
        fix = " ".join(f"actor_rollout_ref.rollout.{k}=1" for k in wrong)
        raise ValueError(f"hf rollout runs one process per replica; got {wrong}: set {fix}")


class HFServer:
    """Ray actor answering `generate` (token in, token out) with an HFGenerator; loads weights on demand.

    Args:
        config: the rollout config (response/prompt lengths, dtype, seed, max_num_seqs).
        model_config: `actor_rollout_ref.model` as verl passes it to replicas, a raw DictConfig
            (llm_server.py:383), so only `path` and `trust_remote_code` are read.
        replica_rank: seeds this replica's sampling differently from the others.
    """

    def __init__(self, config: RolloutConfig, model_config: DictConfig, replica_rank: int) -> None:
        self.config = config
        path = copy_to_local(model_config.path)
        self.generator = HFGenerator.from_pretrained(
            path,
            max_model_len=config.max_model_len or config.prompt_length + config.response_length,
            default_max_tokens=config.response_length,
            dtype=PrecisionType.to_dtype(config.dtype),
            trust_remote_code=model_config.get("trust_remote_code", False),
            max_batch_size=config.max_num_seqs,
            seed=config.seed + replica_rank,
        )
        # One line on the driver's console (Ray prefixes it with the actor): which model each replica serves.
        parameters = sum(p.numel() for p in self.generator.model.parameters())
        print(
            f"hf rollout server {replica_rank}: {path} ({parameters / 1e6:.1f}M parameters, {config.dtype}), "
            f"up to {self.generator.max_batch_size} sequences of {self.generator.max_model_len} tokens",
            flush=True,
        )
        self._admitting = asyncio.Event()  # cleared between abort_all_requests and resume_generation
        self._admitting.set()
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def ready(self) -> bool:
        """verl waits for this before it sends requests: the in-process server is ready at once."""
        return True

    async def generate(
        self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str, **kwargs: Any
    ) -> TokenOutput:
        """vLLM server's contract (vllm_async_server.py `generate`), including its default `max_tokens`."""
        if "max_tokens" not in sampling_params and "max_new_tokens" not in sampling_params:
            budget = self.config.prompt_length + self.config.response_length - len(prompt_ids)
            sampling_params = {**sampling_params, "max_tokens": max(1, min(self.config.response_length, budget))}
        await self._admitting.wait()
        self._in_flight += 1
        self._idle.clear()
        try:
            return await self.generator.generate(
                request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, **kwargs
            )
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()

    async def abort_all_requests(self, reject_request: bool = False) -> None:
        """The async trainers' pause before a weight update. vLLM cuts running requests short (partial
        rollout); here they run to their end, which is short on CPU's tiny models, and new ones wait
        for `resume_generation`. `reject_request` (fail instead of wait) is not supported and ignored."""
        self._admitting.clear()
        await self._idle.wait()

    async def resume_generation(self) -> None:
        """Admit requests again after `abort_all_requests`."""
        self._admitting.set()

    def load_weights(self, weights: list[tuple[str, torch.Tensor]], global_steps: int | None = None) -> int:
        """Load the trainer's weights into the generator (tagged `global_steps`); returns how many tensors."""
        return self.generator.load_weights(weights, global_steps=global_steps)

    async def sleep(self) -> None:
        """Weights and KV cache live in host memory: nothing to release between rollouts."""

    async def wake_up(self) -> None:
        """Nothing was released by `sleep`."""


class HFReplica(RolloutReplica):
    """One `hf` server per training worker, colocated with it (verl's hybrid mode)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _check_single_process(self.config)

    async def launch_servers(self) -> None:
        """Start the replica's server beside its training worker (hybrid mode only)."""
        if self.rollout_mode != RolloutMode.HYBRID:
            raise NotImplementedError(
                f"hf rollout runs colocated with the trainer (hybrid mode), not {self.rollout_mode.value}: "
                "keep actor_rollout_ref.hybrid_engine=True and trainer.v1.trainer_mode sync or colocate_async "
                "(separate_async runs rollout on its own GPUs)"
            )
        node_id = await self.workers[0].__ray_call__.remote(lambda worker: ray.get_runtime_context().get_node_id())
        name = server_actor_name(self.replica_rank)
        server = (
            ray.remote(HFServer)
            .options(
                name=name,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
                max_concurrency=self.max_concurrency,
            )
            .remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
        )
        await server.ready.remote()
        self.servers = [server]
        self._server_handle = server
        self._server_address = name  # a key for verl's load balancer; generation goes through the handle


class HFServerAdapter(BaseRollout):
    """In the training worker: hands the trainer's full weights to this worker's `hf` server each step."""

    def __init__(self, config, model_config, device_mesh, replica_rank: int = -1) -> None:
        super().__init__(config, model_config, device_mesh)
        _check_single_process(self.config)
        self.replica_rank = int(os.environ["RANK"]) if replica_rank == -1 else replica_rank
        self.is_leader_rank = True
        self.bucket_bytes = self.config.checkpoint_engine.update_weights_bucket_megabytes << 20

    async def resume(self, tags: list[str]) -> None:
        """Weights and cache never left host memory."""

    async def release(self) -> None:
        """Nothing to release on CPU."""

    async def update_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        wire_format: str = "named_tensors",
        global_steps: int | None = None,
        peft_config: Any = None,
        **kwargs: Any,
    ) -> None:
        """Send full tensors in buckets of `checkpoint_engine.update_weights_bucket_megabytes`.

        Every rank consumes the whole generator: FSDP's `full_tensor()` inside it is a collective.
        """
        if wire_format != "named_tensors":
            raise NotImplementedError(f"hf rollout receives full tensors only, not wire_format={wire_format!r}")
        if peft_config is not None:
            raise NotImplementedError(
                "hf rollout loads merged weights only: set actor_rollout_ref.model.lora.merge=True"
            )
        server = ray.get_actor(server_actor_name(self.replica_rank))
        bucket: list[tuple[str, torch.Tensor]] = []
        size = 0
        for name, tensor in weights:
            tensor = tensor.detach().to("cpu")
            bucket.append((name, tensor))
            size += tensor.numel() * tensor.element_size()
            if size >= self.bucket_bytes:
                await server.load_weights.remote(bucket)
                bucket, size = [], 0
        await server.load_weights.remote(bucket, global_steps)
