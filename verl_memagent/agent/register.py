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
    """Write the entries into verl's registry; a name another loop holds already is refused, naming both.

    verl's `register(name)` decorator needs the class itself and writes only its path
    (experimental/agent_loop/agent_loop.py:470-475); the worker instantiates any entry it finds, as
    it does the entries of an agent-loop YAML, so the YAML's entries are written without the import.
    That decorator overwrites a name silently; verl's other registries (estimators, trainers) refuse
    a second registration, and so does this one: a loop of another plugin would otherwise vanish.
    """
    registry, entries = agent_loop._agent_loop_registry, agent_loop_entries()
    taken = {name: registry[name] for name in entries if name in registry and registry[name] != entries[name]}
    if taken:
        held = ", ".join(f"{name!r} by {dict(entry).get('_target_')}" for name, entry in sorted(taken.items()))
        raise ValueError(
            f"verl_memagent cannot register its agent loops: the names are taken ({held}). Rename the other "
            "loops, or leave this plugin out with VERL_USE_EXTERNAL_PLUGINS (a comma list without memagent)"
        )
    registry.update(entries)


when_imported(AGENT_LOOP_MODULE, _register)
