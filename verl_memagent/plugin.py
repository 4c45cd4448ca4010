"""The entry point verl loads on `import verl` (group `verl.plugins`): registrations only.

Each module named in PROVIDES registers its pieces with verl's own registries when imported.
Keep it light: no CUDA call, no network, nothing heavier than what verl itself imports.
"""

import importlib

#: module -> {verl registry: names the module registers there}. `verl-memagent doctor` checks that
#: every name is visible in verl after `import verl`.
PROVIDES: dict[str, dict[str, list[str]]] = {
    "verl_memagent.cpu.register": {"platform": ["cpu"], "rollout": ["hf"]},
    "verl_memagent.agent": {"agent_loop": ["memsearcher", "mem1", "react"]},
    "verl_memagent.algo.register": {
        "adv_estimator": ["multi_context_grpo", "multi_context_gae"],
        "trainer": ["memagent_sync", "memagent_colocate_async", "memagent_separate_async"],
    },
}

for _module in PROVIDES:
    importlib.import_module(_module)
