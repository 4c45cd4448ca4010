"""Per-trajectory advantages for multi-context agents: estimators (pure tensors) and the verl trainer
that hands them each sample's trajectory and turn."""
