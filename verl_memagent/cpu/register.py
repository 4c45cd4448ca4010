"""Registrations verl's plugin loader runs in every process: the `cpu` platform and the `hf` rollout.

Registering changes nothing by itself: verl uses the platform only under `VERL_PLATFORM=cpu` and the
backend only under `actor_rollout_ref.rollout.name=hf`. The platform registers at once: `import verl`
has already loaded the platform registry, torch and psutil that `platform` needs. The rollout
modules are heavy, so the `hf` entries are added when verl imports its registries, not before.
verl's workarounds (`patches`) are installed only when the `cpu` platform is selected, and first:
when verl changed under one of them, `install` raises and the platform is not registered, so verl
stops at once (unknown platform) after the logged reason, instead of running half patched.
"""

from __future__ import annotations

from verl.plugin.platform.platform_manager import PlatformRegistry

from verl_memagent.cpu import cpu_platform_requested, patches, platform
from verl_memagent.import_hooks import when_imported

HF_SERVER_ADAPTER = "verl_memagent.cpu.hf_rollout.HFServerAdapter"


def _load_hf_replica():
    from verl_memagent.cpu.hf_rollout import HFReplica

    return HFReplica


def _register_replica(replica_module) -> None:
    replica_module.RolloutReplicaRegistry.register("hf", _load_hf_replica)


def _register_server_adapter(base_module) -> None:
    # verl has no register function for the adapter a training worker builds from `rollout.name`:
    # `get_rollout_class` reads the module dict `_ROLLOUT_REGISTRY` (workers/rollout/base.py:89).
    base_module._ROLLOUT_REGISTRY[("hf", "async")] = HF_SERVER_ADAPTER


if cpu_platform_requested():
    patches.install()
PlatformRegistry.register(platform=platform.NAME)(platform.PlatformCPU)
when_imported("verl.workers.rollout.replica", _register_replica)
when_imported("verl.workers.rollout.base", _register_server_adapter)


def cpu_path_problems() -> list[str]:
    """Why verl's trainer could not run on CPU here (empty when it can): what `doctor` reports."""
    import torch.distributed
    from verl.plugin.platform.platform_manager import PlatformRegistry
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    problems = []
    if PlatformRegistry.get(platform.NAME) is not platform.PlatformCPU:
        problems.append("the cpu platform is not registered with verl")
    if "hf" not in RolloutReplicaRegistry._registry:
        problems.append("the hf rollout is not registered with verl")
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        problems.append("this torch build has no gloo backend for CPU collectives")
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401  (FSDP2)
    except ImportError:
        problems.append("this torch has no FSDP2 (torch.distributed.fsdp.fully_shard); torch>=2.6 needed")
    problems += [f"verl changed under a CPU patch: {stale}" for stale in patches.check_targets()]
    return problems
