"""The gloo checkpoint engine (`verl_memagent.cpu.gloo_checkpoint_engine`) moves weights for real: a
trainer process and a rollout process, each a fresh interpreter that builds its engine from verl's config
as verl's workers do (`checkpoint_engine.custom_backend_module` registers it), driven as verl's
`CheckpointEngineManager` drives them (prepare, build_topology, init_process_group, send/receive,
finalize), over gloo on 127.0.0.1. The tiny model's state dict, with tensors of other dtypes and odd
lengths between, crosses in several buckets (the largest tensors split) and arrives bit for bit.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from queue import Empty

import pytest
import torch

from verl_memagent.cpu import GLOO_BACKEND, GLOO_BACKEND_MODULE

BUCKET_MB = 1  # the model: 5.5 MB in 27 tensors; the embedding and lm_head, 2 MB each, split in two
UPDATES = 2


def next_message(queue, process):
    """The process's next message, waiting as long as it lives (a niced test on a busy machine starts its
    processes slowly; pytest's timeout bounds the wait); its exit code if it ends without one."""
    while True:
        try:
            return queue.get(timeout=1)
        except Empty:
            assert process.is_alive(), f"the {process.name} process ended with {process.exitcode}"


def engine_config(**engine_kwargs):
    """verl's `CheckpointEngineConfig` as a run reads it from `actor_rollout_ref.rollout.checkpoint_engine`."""
    from verl.utils.config import omega_conf_to_dataclass

    from verl_memagent.agent import verl_trainer_config

    settings = {
        "backend": GLOO_BACKEND,
        "custom_backend_module": GLOO_BACKEND_MODULE,
        "update_weights_bucket_megabytes": BUCKET_MB,
        "engine_kwargs": {GLOO_BACKEND: {"host": "127.0.0.1", **engine_kwargs}},
    }
    config = verl_trainer_config(**{f"checkpoint_engine.{key}": value for key, value in settings.items()})
    return omega_conf_to_dataclass(config.actor_rollout_ref.rollout.checkpoint_engine)


def update(weights: dict[str, torch.Tensor], round_: int) -> dict[str, torch.Tensor]:
    """The weights of the `round_`-th update: each one differs from the last."""
    return {name: tensor + round_ for name, tensor in weights.items()}


async def receive_all(engine) -> dict[str, torch.Tensor]:
    """One update's weights, copied as they come (a yielded tensor may be a view of a bucket)."""
    return {name: tensor.clone() async for name, tensor in engine.receive_weights()}


def engine_process(role: str, configs: list, state_path: str, to_manager, from_manager) -> None:
    """One side of the sync in a fresh process, its engines built as verl's workers build them (the actor's
    `engine_workers.py`, the rollout's `CheckpointEngineWorker`); the manager (the test) runs in between.
    It first reports whether `gloo` was registered before the config asked for it, and the engines' class."""
    from verl.checkpoint_engine import CheckpointEngineRegistry
    from verl.utils.import_utils import import_external_libs

    sender = role == "trainer"
    weights = torch.load(state_path)
    registered_before = GLOO_BACKEND in CheckpointEngineRegistry._registry
    received = []
    for config in configs:
        import_external_libs(config.custom_backend_module)
        engine = CheckpointEngineRegistry.new(
            config.backend,
            bucket_size=config.update_weights_bucket_megabytes << 20,
            **({"is_master": True} if sender else {}),
            **config.engine_kwargs.get(config.backend, {}),
        )
        to_manager.put((registered_before, f"{type(engine).__module__}.{type(engine).__name__}"))
        for round_ in range(UPDATES):
            to_manager.put(engine.prepare())
            engine.init_process_group(**from_manager.get())
            if sender:
                asyncio.run(engine.send_weights(iter(update(weights, round_).items())))
            else:
                received.append(asyncio.run(receive_all(engine)))
            engine.finalize()
    if not sender:
        torch.save(received, state_path + ".received")


@pytest.fixture
def weights(tiny_model) -> dict[str, torch.Tensor]:
    """The tiny model's state dict, with a bf16, an odd-length int8 and a float64 tensor put between its
    float32 ones, so that buckets hold tensors of several sizes at offsets that need aligning."""
    state = dict(tiny_model.state_dict())
    names = list(state)
    extra = {
        "odd.bf16": torch.randn(7, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16),
        "odd.int8": torch.arange(-5, 6, dtype=torch.int8),
        "odd.float64": torch.randn(3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1)),
    }
    return {**{n: state[n] for n in names[:3]}, **extra, **{n: state[n] for n in names[3:]}}


def test_weights_arrive_bit_for_bit(weights, tmp_path):
    """Two updates on a group kept between them (verl's default), then two on one rebuilt at each."""
    from verl.checkpoint_engine import CheckpointEngineManager

    bucket = BUCKET_MB << 20
    assert max(t.nbytes for t in weights.values()) > bucket
    assert sum(t.nbytes for t in weights.values()) > 4 * bucket
    configs = [engine_config(), engine_config(rebuild_group=True)]
    state_path = str(tmp_path / "state.pt")
    torch.save(weights, state_path)
    spawn = multiprocessing.get_context("spawn")
    queues = {role: (spawn.Queue(), spawn.Queue()) for role in ("trainer", "rollout")}
    processes = {
        role: spawn.Process(target=engine_process, args=(role, configs, state_path, *queues[role]), name=role)
        for role in queues
    }
    for process in processes.values():
        process.start()
    try:
        for config in configs:
            manager = CheckpointEngineManager(config, actor_wg=None, replicas=[])
            for role in processes:
                registered_before, engine_class = next_message(queues[role][0], processes[role])
                assert not registered_before, "the plugin registered the gloo engine before it was asked for"
                assert engine_class == f"{GLOO_BACKEND_MODULE}.GlooCheckpointEngine"
            for _ in range(UPDATES):
                metadata = [next_message(queues[role][0], processes[role]) for role in ("trainer", "rollout")]
                trainer_kwargs, rollout_kwargs = manager.backend_cls.build_topology(1, 1, metadata)
                queues["trainer"][1].put({key: values[0] for key, values in trainer_kwargs.items()})
                queues["rollout"][1].put({key: values[0] for key, values in rollout_kwargs.items()})
        for role, process in processes.items():
            process.join()
            assert process.exitcode == 0, f"the {role} process ended with {process.exitcode}"
    finally:
        for process in processes.values():
            process.kill()

    received = torch.load(state_path + ".received")
    assert len(received) == len(configs) * UPDATES
    for i, got in enumerate(received):
        sent = update(weights, i % UPDATES)
        assert list(got) == list(sent)
        for name, tensor in sent.items():
            assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
            assert torch.equal(got[name].view(torch.uint8), tensor.contiguous().view(torch.uint8)), name


def test_only_actor_rank_0_sends():
    """An actor rank outside the group walks the weight generator (producing a weight is collective over
    the actor group) and sends nothing; a rollout rank refuses to send, the trainer to receive."""
    from verl_memagent.cpu.gloo_checkpoint_engine import GlooCheckpointEngine, MasterMetadata

    master = MasterMetadata(host="127.0.0.1", port=1, group="unused")
    engine = GlooCheckpointEngine(1 << 20, host="127.0.0.1")
    engine.init_process_group(rank=-1, world_size=2, master_metadata=master)
    produced = []
    asyncio.run(engine.send_weights(produced.append(name) or (name, torch.zeros(2)) for name in "abc"))
    assert produced == ["a", "b", "c"]

    engine.rank = 1
    with pytest.raises(RuntimeError, match="only the actor side sends"):
        asyncio.run(engine.send_weights(iter([])))
    engine.rank = 0

    with pytest.raises(RuntimeError, match="only rollout workers receive"):
        asyncio.run(receive_all(engine))
