"""Examples built on verl-memagent, kept out of the plugin that every verl process imports.

- `scripted.ScriptedPolicy`: a policy behind verl's token-in/token-out `generate()` that replays
  given texts; the demo's warm start plays demonstrations with it, and tests and benchmarks pin
  exact multi-turn paths with it.
- `learn_codes`: the CPU main job's password task (`recipes/cpu/learn_codes.sh`): task data, warm
  start and reward curve.
"""
