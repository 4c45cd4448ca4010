"""Evaluation of the agents with the training turn logic: `verl-memagent eval` (see docs/eval.md).

`tasks` loads the datasets as verl rows (FlashRAG JSON lines, MEM1's composed tasks, prepared
parquet), `runner.evaluate` runs and reports, `openai_client.CompletionsClient` talks to vLLM/SGLang,
`records`, `report` and `plot` build the per-task lines, the summary and the PNG.
"""
