"""Memory agent loops for verl: `memsearcher`, `mem1` and the `react` baseline.

Importing this package registers the three names with verl's agent-loop registry (default
settings); `AGENT_LOOPS_YAML` is the same three as a file for
`actor_rollout_ref.rollout.agent.agent_loop_config_path`, where settings can be changed.
"""

from verl_memagent.agent.factory import AGENT_LOOPS_YAML, instantiate_agent_loop, verl_trainer_config
from verl_memagent.agent.mem1 import Mem1AgentLoop
from verl_memagent.agent.memsearcher import MemSearcherAgentLoop
from verl_memagent.agent.react import ReactAgentLoop

__all__ = [
    "AGENT_LOOPS_YAML",
    "Mem1AgentLoop",
    "MemSearcherAgentLoop",
    "ReactAgentLoop",
    "instantiate_agent_loop",
    "verl_trainer_config",
]
