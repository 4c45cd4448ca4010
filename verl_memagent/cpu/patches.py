"""Every change to verl's behaviour that running its trainer on CPU needs, in one place.

Installed only when the `cpu` platform is selected (`VERL_PLATFORM=cpu`), in each process, and each
applied when verl imports the module it concerns. Each patch names the verl 0.9.1 line it works
around and the source text it expects there; `check_targets()` (run by the tests and `doctor`) fails
loudly when a verl upgrade moves or changes that text, so a stale patch is never applied blindly.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

from verl_memagent.cpu.import_hooks import when_imported


@dataclass(frozen=True)
class Patch:
    module: str
    where: str  # verl file:line worked around
    expects: str  # source text at that line; its absence means verl changed under the patch
    apply: Callable[[ModuleType], None]


def _gloo_only_process_group(distributed: ModuleType) -> None:
    # verl builds the backend "cpu:gloo,{device}:{backend}", i.e. "cpu:gloo,cpu:gloo" on CPU, which torch
    # refuses ("Duplicate device type cpu"); the engine workers call it without a backend.
    original = distributed.initialize_global_process_group_ray

    @functools.wraps(original)
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return original(timeout_second=timeout_second, backend=backend or "cpu:gloo")

    distributed.initialize_global_process_group_ray = initialize_global_process_group_ray


def _fsdp2_engines_on_cpu(transformer_impl: ModuleType) -> None:
    # The FSDP engines are registered for devices cuda and npu only. FSDP2 (fully_shard) runs on CPU
    # with gloo; FSDP1 does not (transformer_impl.py:441-444 passes an integer `device_id`), so only
    # `strategy=fsdp2` is registered for "cpu" and `strategy=fsdp` fails with verl's own error.
    from verl.workers.engine.base import EngineRegistry

    EngineRegistry.register(model_type="language_model", backend="fsdp2", device="cpu")(
        transformer_impl.FSDPEngineWithLMHead
    )
    EngineRegistry.register(model_type="value_model", backend="fsdp2", device="cpu")(
        transformer_impl.FSDPEngineWithValueHead
    )


def _unpinned_cpu_offload(transformer_impl: ModuleType) -> None:
    # Forward-only engines (the reference model) use CPUOffloadPolicy(pin_memory=True); pinning host
    # memory needs an accelerator runtime. On CPU the parameters already are in host memory.
    transformer_impl.CPUOffloadPolicy = functools.partial(transformer_impl.CPUOffloadPolicy, pin_memory=False)


PATCHES: tuple[Patch, ...] = (
    Patch(
        "verl.utils.distributed",
        "verl/utils/distributed.py:89",
        'backend = backend or f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"',
        _gloo_only_process_group,
    ),
    Patch(
        "verl.workers.engine.fsdp.transformer_impl",
        "verl/workers/engine/fsdp/transformer_impl.py:1143,1594",
        '@EngineRegistry.register(model_type="language_model", backend=["fsdp", "fsdp2"], device=["cuda", "npu"])',
        _fsdp2_engines_on_cpu,
    ),
    Patch(
        "verl.workers.engine.fsdp.transformer_impl",
        "verl/workers/engine/fsdp/transformer_impl.py:462",
        "offload_policy = CPUOffloadPolicy(pin_memory=True)",
        _unpinned_cpu_offload,
    ),
)

_installed = False


def install() -> None:
    """Apply every patch in this process, each when (or if already) its verl module is imported."""
    global _installed
    if _installed:
        return
    _installed = True
    for patch in PATCHES:
        when_imported(patch.module, patch.apply)


def installed() -> bool:
    return _installed


def check_targets() -> list[str]:
    """The patches whose expected verl source is missing (verl changed): empty when all still fit."""
    stale = []
    for patch in PATCHES:
        source = inspect.getsource(importlib.import_module(patch.module))
        if patch.expects not in source:
            stale.append(f"{patch.where}: expected {patch.expects!r}")
    return stale
