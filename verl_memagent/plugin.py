"""The entry point verl loads on `import verl` (group `verl.plugins`): registrations only.

Each module named in PROVIDES registers its pieces with verl's own registries. None of them imports
a verl module that `import verl` has not loaded already: a registration into a heavier one (the
agent-loop, estimator, trainer and rollout registries) is made when verl itself imports that module
(`import_hooks.when_imported`). `benchmarks/plugin_import.py` measures what the plugin adds to
`import verl`, and `tests/test_plugin.py` asserts which modules it may load.
"""

import importlib

#: module -> {verl registry: names the module registers there}. `verl-memagent doctor` checks that
#: every name is visible once verl has imported its registries.
PROVIDES: dict[str, dict[str, list[str]]] = {
    "verl_memagent.cpu.register": {"platform": ["cpu"], "rollout": ["hf"]},
    "verl_memagent.agent.register": {"agent_loop": ["memsearcher", "mem1", "react"]},
    "verl_memagent.algo.register": {
        "adv_estimator": ["multi_context_grpo", "multi_context_gae"],
        "trainer": ["memagent_sync", "memagent_colocate_async", "memagent_separate_async"],
    },
}

for _module in PROVIDES:
    importlib.import_module(_module)
