"""verl-memagent: memory-managing search agents (MemSearcher, MEM1) trained with RL on verl 0.9."""

__version__ = "0.1.0"
