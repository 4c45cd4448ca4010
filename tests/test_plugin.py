"""verl must find the plugin by itself (a plain `import verl` in a fresh interpreter), and the plugin
must stay light there: it loads only its registration modules, and each registration becomes visible
once verl imports the registry it extends."""

import json
import os
import subprocess
import sys

import pytest

from verl_memagent import plugin

#: one fresh interpreter as a verl process meets the plugin: the modules a plain `import verl` loaded (read
#: before anything else imports more), the registrations the plugin made, then the agent loops as a rollout
#: worker loads them (one interpreter for all three: each start imports verl, 8-13 s here)
PROBE = """
import json, sys
import verl
modules = sorted(sys.modules)
from verl_memagent import plugin
from verl_memagent.doctor import _registry
seen = {kind: sorted(_registry(kind)) for kinds in plugin.PROVIDES.values() for kind in kinds}
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
print(json.dumps({"modules": modules, "provides": plugin.PROVIDES, "seen": seen, "registered": registered,
                  "shipped": shipped, "classes": classes, "yaml_kept": kept}))
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


def _run(code: str, **env: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env}, check=True
    )
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def probe() -> dict:
    """PROBE's findings, verl's plugins as a user leaves them (all of them)."""
    return json.loads(_run(PROBE))


@pytest.fixture(scope="module")
def without_plugins() -> set[str]:
    """The modules `import verl` loads with external plugins off."""
    return set(json.loads(_run(MODULES_PROBE, VERL_USE_EXTERNAL_PLUGINS="none")))


def test_import_verl_loads_plugin_and_its_registrations(probe):
    assert "verl_memagent.plugin" in probe["modules"]
    for kinds in probe["provides"].values():
        for kind, names in kinds.items():
            assert set(names) <= set(probe["seen"][kind]), (kind, names)


def test_plugin_policy_none_disables_loading(without_plugins):
    # proves that verl's entry-point discovery, not an import of ours, loads the plugin
    assert "verl_memagent.plugin" not in without_plugins
    probe = "import sys, verl; print('verl_memagent.plugin' in sys.modules)"
    assert _run(probe, VERL_USE_EXTERNAL_PLUGINS="memagent") == "True"


def test_import_verl_loads_only_the_registration_modules(probe, without_plugins):
    with_plugin = set(probe["modules"])
    assert [m for m in with_plugin if m.split(".")[0] in HEAVY] == []
    assert {m for m in with_plugin if m.startswith("verl_memagent")} == REGISTRATION_MODULES
    assert with_plugin - without_plugins == REGISTRATION_MODULES  # not one module of verl or a library more


def test_agent_loops_register_by_class_path_and_never_overwrite_a_yaml_entry(probe):
    for name in ("memsearcher", "mem1", "react"):
        entry = probe["registered"][name]  # the shipped YAML's entry, class path and settings, as the worker loads it
        assert entry == probe["shipped"][name] and entry["_target_"].startswith(f"verl_memagent.agent.{name}.")
        assert probe["classes"][name] == name  # the class behind the path is that agent
    assert probe["yaml_kept"] == {"memsearcher": True, "mem1": True, "react": True}
