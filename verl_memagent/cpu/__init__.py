"""verl on CPU: the `cpu` platform, the `hf` rollout backend and the verl workarounds they need.

Nothing here runs unless asked for (`VERL_PLATFORM=cpu`, `actor_rollout_ref.rollout.name=hf`).
"""
