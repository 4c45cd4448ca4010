"""verl on CPU: the `cpu` platform, the `hf` rollout backend and the verl and vLLM workarounds they need.

Nothing here runs unless asked for (`VERL_PLATFORM=cpu`, `actor_rollout_ref.rollout.name=hf`).
"""

import os

#: the value of VERL_PLATFORM that selects the CPU path, and the name the platform registers under
PLATFORM = "cpu"


def cpu_platform_requested() -> bool:
    """Whether this process is on the CPU path: Ray's workers and vLLM's processes inherit VERL_PLATFORM."""
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM
