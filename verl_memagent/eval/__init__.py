"""Evaluation of the agents with the training turn logic: `verl-memagent eval` (see docs/eval.md).

`runner.evaluate` runs and reports, `openai_client.CompletionsClient` talks to vLLM/SGLang,
`records`, `report` and `plot` build the per-question lines, the summary and the PNG.
"""
