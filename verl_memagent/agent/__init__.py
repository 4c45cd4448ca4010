"""Memory agent loops for verl: `memsearcher`, `mem1` and the `react` baseline.

`AGENT_LOOPS_YAML` lists the three (name, class, settings) for
`actor_rollout_ref.rollout.agent.agent_loop_config_path`; `agent.register` puts the same names into
verl's agent-loop registry when verl imports it. The package itself stays light (the plugin imports
`agent.register` in every verl process): the loops and the factory load on first use of their names.
"""

import importlib
from pathlib import Path

AGENT_LOOPS_YAML = Path(__file__).with_name("agent_loops.yaml")

#: public name -> the module defining it, imported when the name is first used
_LAZY = {
    "Mem1AgentLoop": "verl_memagent.agent.mem1",
    "MemSearcherAgentLoop": "verl_memagent.agent.memsearcher",
    "ReactAgentLoop": "verl_memagent.agent.react",
    "instantiate_agent_loop": "verl_memagent.agent.factory",
    "verl_trainer_config": "verl_memagent.agent.factory",
    "verl_sampling_params": "verl_memagent.agent.factory",
    "verl_worker_row": "verl_memagent.agent.factory",
}

__all__ = ["AGENT_LOOPS_YAML", *_LAZY]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
