"""Registers `memsearcher`, `mem1` and `react` with verl's agent-loop registry, when verl imports it.

The entries are the shipped `agent_loops.yaml`'s, class path and settings, as verl's AgentLoopWorker
stores the entries of an `agent_loop_config_path` file: a loop built from its registry name alone runs
with the released settings of its paper, as one built from that file does (a file passed as
`agent_loop_config_path` replaces these entries). No agent module is imported here: hydra imports the
class when verl's AgentLoopWorker first builds that loop, and the agent modules never register
themselves, so they cannot overwrite entries the worker loaded from a YAML.
"""

from __future__ import annotations

from types import ModuleType

from omegaconf import DictConfig, OmegaConf

from verl_memagent.agent import AGENT_LOOPS_YAML
from verl_memagent.import_hooks import when_imported

AGENT_LOOP_MODULE = "verl.experimental.agent_loop.agent_loop"


def agent_loop_entries() -> dict[str, DictConfig]:
    """Agent name -> its entry (class path and settings) in the shipped agent-loop YAML."""
    return {entry.name: entry for entry in OmegaConf.load(AGENT_LOOPS_YAML)}


def _register(agent_loop: ModuleType) -> None:
    # verl's `register(name)` decorator needs the class itself and writes only its path
    # (experimental/agent_loop/agent_loop.py:470-475); the worker instantiates any entry it finds, as
    # it does the entries of an agent-loop YAML, so the YAML's entries are written without the import.
    agent_loop._agent_loop_registry.update(agent_loop_entries())


when_imported(AGENT_LOOP_MODULE, _register)
