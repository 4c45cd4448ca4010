"""verl must find the plugin by itself (a plain `import verl` in a fresh interpreter), and the plugin
must stay light there: it loads only its registration modules, and each registration becomes visible
once verl imports the registry it extends."""

import json
import os
import subprocess
import sys

from verl_memagent import plugin

PROBE = """
import json, sys
import verl
loaded = "verl_memagent.plugin" in sys.modules
from verl_memagent import plugin
from verl_memagent.doctor import _registry
seen = {kind: sorted(_registry(kind)) for kinds in plugin.PROVIDES.values() for kind in kinds}
print(json.dumps({"loaded": loaded, "provides": plugin.PROVIDES, "seen": seen}))
"""

MODULES_PROBE = "import json, sys, verl; print(json.dumps(sorted(sys.modules)))"

#: what a plain `import verl` must not load because of the plugin: heavy libraries verl's own import
#: does without, and our agent loops (only the rollout workers need them)
HEAVY = ("pandas", "datasets", "sklearn", "fastapi", "uvicorn")
#: the plugin's registration modules and what they import: all of verl_memagent that `import verl` loads
REGISTRATION_MODULES = {
    "verl_memagent",
    "verl_memagent.plugin",
    "verl_memagent.import_hooks",
    *plugin.PROVIDES,
    *(module.rpartition(".")[0] for module in plugin.PROVIDES),
    "verl_memagent.cpu.platform",
    "verl_memagent.cpu.patches",
}

AGENT_LOOPS_PROBE = """
import json, verl
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
from verl_memagent.agent import AGENT_LOOPS_YAML
registered = {name: OmegaConf.to_container(OmegaConf.create(entry)) for name, entry in _agent_loop_registry.items()}
shipped = {entry.name: OmegaConf.to_container(entry) for entry in OmegaConf.load(AGENT_LOOPS_YAML)}
for entry in OmegaConf.load(AGENT_LOOPS_YAML):  # what AgentLoopWorker does with agent_loop_config_path
    _agent_loop_registry[entry.name] = entry
import hydra
classes = {name: hydra.utils.get_class(entry["_target_"]).agent for name, entry in registered.items() if name in
           ("memsearcher", "mem1", "react")}  # imports the agent modules, as the worker's first instantiate does
kept = {name: "topk" in _agent_loop_registry[name] for name in classes}
print(json.dumps({"registered": registered, "shipped": shipped, "classes": classes, "yaml_kept": kept}))
"""


def _run(code: str, **env: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env}, check=True
    )
    return done.stdout.strip().splitlines()[-1]


def test_import_verl_loads_plugin_and_its_registrations():
    result = json.loads(_run(PROBE))
    assert result["loaded"] is True
    for kinds in result["provides"].values():
        for kind, names in kinds.items():
            assert set(names) <= set(result["seen"][kind]), (kind, names)


def test_plugin_policy_none_disables_loading():
    # proves that verl's entry-point discovery, not an import of ours, loads the plugin
    probe = "import sys, verl; print('verl_memagent.plugin' in sys.modules)"
    assert _run(probe, VERL_USE_EXTERNAL_PLUGINS="none") == "False"
    assert _run(probe, VERL_USE_EXTERNAL_PLUGINS="memagent") == "True"


def test_import_verl_loads_only_the_registration_modules():
    with_plugin = set(json.loads(_run(MODULES_PROBE)))
    without = set(json.loads(_run(MODULES_PROBE, VERL_USE_EXTERNAL_PLUGINS="none")))
    assert [m for m in with_plugin if m.split(".")[0] in HEAVY] == []
    assert {m for m in with_plugin if m.startswith("verl_memagent")} == REGISTRATION_MODULES
    assert with_plugin - without == REGISTRATION_MODULES  # not one module of verl or a library more


def test_agent_loops_register_by_class_path_and_never_overwrite_a_yaml_entry():
    result = json.loads(_run(AGENT_LOOPS_PROBE))
    for name in ("memsearcher", "mem1", "react"):
        entry = result["registered"][name]  # the shipped YAML's entry, class path and settings, as the worker loads it
        assert entry == result["shipped"][name] and entry["_target_"].startswith(f"verl_memagent.agent.{name}.")
        assert result["classes"][name] == name  # the class behind the path is that agent
    assert result["yaml_kept"] == {"memsearcher": True, "mem1": True, "react": True}
