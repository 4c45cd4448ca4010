"""Registers `memsearcher`, `mem1` and `react` with verl's agent-loop registry, when verl imports it.

The entries are what verl's `register` decorator writes, `{"_target_": class path}`, read from the
shipped `agent_loops.yaml` (its names and classes; the settings there apply only when that file is
passed as `agent_loop_config_path`, which replaces these entries). No agent module is imported here:
hydra imports the class when verl's AgentLoopWorker first builds that loop, and the agent modules
never register themselves, so they cannot overwrite entries the worker loaded from a YAML.
"""

from __future__ import annotations

from types import ModuleType

from omegaconf import OmegaConf

from verl_memagent.agent import AGENT_LOOPS_YAML
from verl_memagent.import_hooks import when_imported

AGENT_LOOP_MODULE = "verl.experimental.agent_loop.agent_loop"


def agent_loop_targets() -> dict[str, str]:
    """Agent name -> class path, as the shipped agent-loop YAML lists them."""
    return {entry.name: entry._target_ for entry in OmegaConf.load(AGENT_LOOPS_YAML)}


def _register(agent_loop: ModuleType) -> None:
    # verl's `register(name)` decorator needs the class itself; its registry entry is only the path
    # (experimental/agent_loop/agent_loop.py:470-475), so the path is written without the import.
    for name, target in agent_loop_targets().items():
        agent_loop._agent_loop_registry[name] = {"_target_": target}


when_imported(AGENT_LOOP_MODULE, _register)
