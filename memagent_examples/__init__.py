"""Examples built on verl-memagent, kept out of the plugin that every verl process imports.

- `learn_codes`: the CPU learning demo's password task (`recipes/cpu/learn_codes.sh`, docs/learn_codes.md): task
  data, its shipped warm start (`learn_codes/start/`) and the reward curve.
- `composed_doors`: the same doors asked several at a time, with doors no policy trained on, and the
  three agents' shipped warm starts (`composed_doors/starts/`): the papers' claim in miniature.
- `papers_claim`: the sweep that trains and scores the three agents on it (`benchmarks/papers_claim.py`,
  docs/papers_claim.md): its cells, RL runs, scorings and records, and the report.
- The floor both tasks stand on: `doors` (the doors and their words), `warm_start` (one warm-start recipe:
  scripted demonstrations played through the real agent loop), `training` and `copy_rows` (its training
  steps and synthetic rows), `build_records` (what each build writes beside its weights).
- `scripted.ScriptedPolicy`: a policy behind verl's token-in/token-out `generate()` that replays given
  texts; the warm starts play demonstrations with it, and tests and benchmarks pin exact multi-turn
  paths with it. `model_format.ModelFormat`: the texts of an agent's format, read off its loop.
- `retriever_process`: the retriever service started as a child process, for the examples, benchmarks
  and tests.
"""
