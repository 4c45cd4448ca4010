"""verl on CPU: the `cpu` platform, the `hf` rollout backend and the verl and vLLM workarounds they need.

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
