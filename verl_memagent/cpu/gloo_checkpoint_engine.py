"""A checkpoint engine over torch.distributed's gloo backend: verl's weight sync for rollout replicas of
their own (`memagent_separate_async`) on CPU, where verl ships only device transports (NCCL, HCCL, NIXL,
Mooncake, Kimi).

Asked for, not registered by the plugin: importing this module registers the backend `gloo`, which
verl does in every trainer and rollout process when the config names the module:

    actor_rollout_ref.rollout.checkpoint_engine.backend=gloo
    actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=verl_memagent.cpu.gloo_checkpoint_engine

It works as verl's NCCL engine (`verl/checkpoint_engine/nccl_checkpoint_engine.py`) with one sender:
actor rank 0 packs the weights into buckets of `update_weights_bucket_megabytes` (verl's
`split_weight_chunks`; a tensor larger than a bucket is split) and broadcasts each to every rollout
worker, filling the next bucket while one is on the wire (two buffers); the receivers rebuild the
tensors with verl's `merge_weight_chunks`. The bucket's metadata, which NCCL sends over ZeroMQ, goes
over the same gloo group. The group is a standalone one (its own TCP store on actor rank 0): both sides
already use torch's default group for their own ranks. Actor ranks other than 0 sit the broadcast out
but walk the weight generator, since producing a weight is collective over the actor group.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import time
from collections.abc import AsyncGenerator, Generator
from dataclasses import dataclass

import ray
import torch
import torch.distributed as dist
from verl.checkpoint_engine.base import (
    CheckpointEngine,
    CheckpointEngineRegistry,
    TensorMeta,
    merge_weight_chunks,
    split_weight_chunks,
)

from verl_memagent.cpu import GLOO_BACKEND

logger = logging.getLogger(__name__)


@dataclass
class MasterMetadata:
    """Where the receivers find actor rank 0's TCP store, and the key prefix of this group in it."""

    host: str
    port: int
    group: str


def aligned(offset: int, dtype: torch.dtype) -> int:
    """The first offset from `offset` where a `dtype` tensor can be viewed in a byte bucket: verl's NCCL
    engine packs tensors back to back, so a bf16 tensor of odd length before a float32 one would leave the
    latter unviewable (verl's vLLM bucket sender aligns the same way)."""
    return -(-offset // dtype.itemsize) * dtype.itemsize


class GlooBroadcast:
    """One bucket broadcast from rank 0 (metadata, then the bytes), run in a thread so that the event
    loop fills or drains the other buffer meanwhile. The one verl's NCCL engine runs as its
    `BroadcastOperation`, with the metadata over gloo instead of ZeroMQ.
    """

    def __init__(self, group: dist.ProcessGroupGloo, rank: int, bucket: torch.Tensor, metadata: dict | None):
        self.group, self.rank, self.bucket, self.metadata = group, rank, bucket, metadata
        self._task = asyncio.get_running_loop().run_in_executor(None, self._run)

    def _broadcast(self, tensor: torch.Tensor) -> None:
        self.group.broadcast([tensor], dist.BroadcastOptions()).wait()

    def _run(self) -> None:
        if self.rank == 0:
            payload = torch.frombuffer(bytearray(pickle.dumps(self.metadata)), dtype=torch.uint8)
            self._broadcast(torch.tensor([payload.numel()], dtype=torch.int64))
            self._broadcast(payload)
        else:
            length = torch.empty(1, dtype=torch.int64)
            self._broadcast(length)
            payload = torch.empty(int(length), dtype=torch.uint8)
            self._broadcast(payload)
            self.metadata = pickle.loads(payload.numpy().tobytes())
            self.bucket = self.bucket[: self.metadata["length"]]
        self._broadcast(self.bucket)

    async def wait_for_complete(self) -> dict:
        """The bucket's metadata once its bytes have arrived (rank 0: once they are sent)."""
        await self._task
        return self.metadata


@CheckpointEngineRegistry.register(GLOO_BACKEND)
class GlooCheckpointEngine(CheckpointEngine):
    """Trainer-to-rollout weight sync over gloo (CPU), with verl's `CheckpointEngine` interface.

    Args:
        bucket_size: Bytes sent at once. Two buffers of this size are reserved (`torch.empty`: only the
            pages a bucket fills are ever touched, so verl's 2 GB default costs the model's size).
        is_master: Whether this is actor rank 0, the sender; verl sets it on the actor side.
        rebuild_group: Make a new gloo group at every weight update instead of once (verl's option).
        host: The address this process's gloo endpoint (and, on actor rank 0, the TCP store) listens on.
            By default the Ray node's address, as verl's NCCL engine does, since rollout replicas may sit on
            other nodes; `127.0.0.1` keeps a one-machine run off the network.
    """

    def __init__(
        self, bucket_size: int, is_master: bool = False, rebuild_group: bool = False, host: str | None = None
    ) -> None:
        self.bucket_size = bucket_size
        self.is_master = is_master
        self.rebuild_group = rebuild_group
        self.host = host or ray.util.get_node_ip_address().strip("[]")
        self.store: dist.TCPStore | None = None
        self.group: dist.ProcessGroupGloo | None = None
        self.groups_made = 0
        self.rank: int | None = None
        self.world_size: int | None = None

    def prepare(self) -> MasterMetadata | None:
        """Reserve the two buckets; actor rank 0 also opens its TCP store and says where it is."""
        self.send_buf = torch.empty(self.bucket_size, dtype=torch.uint8)
        self.recv_buf = torch.empty(self.bucket_size, dtype=torch.uint8)
        if not self.is_master:
            return None
        if self.store is None:
            self.store = dist.TCPStore(self.host, 0, is_master=True, wait_for_workers=False)
        group = f"{GLOO_BACKEND}_checkpoint_engine/{self.groups_made if self.rebuild_group else 0}"
        return MasterMetadata(host=self.host, port=self.store.port, group=group)

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list):
        """Actor rank 0 is rank 0 of the group, the rollout workers ranks 1..n; other actor ranks get -1."""
        master = metadata[0]
        if not isinstance(master, MasterMetadata):
            raise RuntimeError(
                "the gloo checkpoint engine's sender is actor rank 0, whose prepare() did not report it: "
                "verl builds the actor side's engine with is_master=(rank == 0)"
            )
        world_size = rollout_world_size + 1
        actor_kwargs = {
            "rank": [0] + [-1] * (actor_wg_world_size - 1),
            "world_size": [world_size] * actor_wg_world_size,
            "master_metadata": [master] * actor_wg_world_size,
        }
        rollout_kwargs = {
            "rank": list(range(1, world_size)),
            "world_size": [world_size] * rollout_world_size,
            "master_metadata": [master] * rollout_world_size,
        }
        return actor_kwargs, rollout_kwargs

    def init_process_group(self, rank: int, world_size: int, master_metadata: MasterMetadata):
        """Join the gloo group of actor rank 0 and the rollout workers (kept across updates unless
        `rebuild_group`); an actor rank that does not send only records its rank of -1."""
        if rank < 0 or (self.group is not None and not self.rebuild_group):
            if self.group is not None and (rank, world_size) != (self.rank, self.world_size):
                raise RuntimeError(
                    f"gloo checkpoint engine: rank {rank} of {world_size} asked of a group made as rank "
                    f"{self.rank} of {self.world_size}; with a changing set of replicas set "
                    f"checkpoint_engine.engine_kwargs.{GLOO_BACKEND}.rebuild_group=True"
                )
            self.rank, self.world_size = rank, world_size
            return
        store = self.store if self.is_master else dist.TCPStore(master_metadata.host, master_metadata.port)
        options = dist.ProcessGroupGloo._Options()
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=self.host)]
        self.group = dist.ProcessGroupGloo(dist.PrefixStore(master_metadata.group, store), rank, world_size, options)
        self.groups_made += 1
        self.rank, self.world_size = rank, world_size
        self.group.barrier().wait()
        logger.info(f"gloo checkpoint engine: rank {rank} of {world_size} joined {master_metadata.group}")

    def finalize(self):
        """Free the buckets; drop the group when it is rebuilt at each update."""
        if self.rebuild_group and self.group is not None:
            self.group.shutdown()
            self.group = None
        self.send_buf = self.recv_buf = None

    @torch.no_grad()
    async def send_weights(
        self, weights: Generator[tuple[str, torch.Tensor], None, None], global_steps: int | None = None
    ):
        """Broadcast the weights from actor rank 0, bucket by bucket; other actor ranks walk the generator."""
        if self.rank is None or self.rank > 0:
            raise RuntimeError(
                f"gloo checkpoint engine: send_weights on group rank {self.rank}; only the actor side sends, "
                "after prepare(), build_topology() and init_process_group() (verl's CheckpointEngineManager)"
            )
        if self.rank < 0:
            for _ in weights:
                pass
            return
        start = time.time()
        send_buf, next_buf = self.send_buf, self.recv_buf
        broadcast, bucket_meta, offset = None, {}, 0
        async for tensor_meta, chunk in split_weight_chunks(weights, self.bucket_size):
            offset = aligned(offset, tensor_meta.dtype)
            if offset + tensor_meta.chunk_size > self.bucket_size:
                if broadcast is not None:
                    await broadcast.wait_for_complete()
                broadcast = self._broadcast(send_buf[:offset], bucket_meta, offset, is_last=False)
                send_buf, next_buf = next_buf, send_buf
                bucket_meta, offset = {}, 0
            tensor_meta.offset = offset
            bucket_meta[tensor_meta.name] = tensor_meta
            send_buf[offset : offset + tensor_meta.chunk_size] = chunk
            offset += tensor_meta.chunk_size
        if broadcast is not None:
            await broadcast.wait_for_complete()
        await self._broadcast(send_buf[:offset], bucket_meta, offset, is_last=True).wait_for_complete()
        logger.info(f"gloo checkpoint engine: weights sent in {time.time() - start:.2f} s")

    def _broadcast(self, bucket: torch.Tensor, bucket_meta: dict[str, TensorMeta], length: int, is_last: bool):
        metadata = {"bucket_meta": bucket_meta, "is_last": is_last, "length": length}
        return GlooBroadcast(self.group, self.rank, bucket, metadata)

    @torch.no_grad()
    async def receive_weights(self, global_steps: int | None = None) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        """Yield (name, tensor) as the buckets arrive. A tensor may be a view of a bucket, valid until the
        next one is asked for, as with verl's NCCL engine: the server adapter copies each as it comes."""
        if self.rank is None or self.rank < 1:
            raise RuntimeError(
                f"gloo checkpoint engine: receive_weights on group rank {self.rank}; only rollout workers "
                "receive, after init_process_group()"
            )
        async for name, weight in merge_weight_chunks(self._receive_chunks(), self.bucket_size):
            yield name, weight

    async def _receive_chunks(self) -> AsyncGenerator[tuple[TensorMeta, torch.Tensor], None]:
        start, total_bytes = time.time(), 0
        ready_buf, next_buf = self.recv_buf, self.send_buf
        metadata = await GlooBroadcast(self.group, self.rank, ready_buf, None).wait_for_complete()
        while True:
            total_bytes += metadata["length"]
            arriving = None if metadata["is_last"] else GlooBroadcast(self.group, self.rank, next_buf, None)
            for tensor_meta in metadata["bucket_meta"].values():
                yield tensor_meta, ready_buf[tensor_meta.offset : tensor_meta.offset + tensor_meta.chunk_size]
            if arriving is None:
                break
            metadata = await arriving.wait_for_complete()
            ready_buf, next_buf = next_buf, ready_buf
        logger.info(f"gloo checkpoint engine: {total_bytes} bytes received in {time.time() - start:.2f} s")
