"""The papers' claim in miniature: does a memory agent keep its context flat as the task grows, and still answer?

MemSearcher, MEM1 and ReAct on the composed password task (`memagent_examples.composed_doors`): one
question asks for the passwords of k doors. The three agents start from one tiny model, copy-pretrained
once, then each is warm-started the same way and trained with RL through verl's real trainer on the same
budget (`recipes/cpu/composed_doors.yaml`), under the same limits (`composed_doors_agent_loops.yaml`).
Before and after RL each agent is scored greedily by `verl-memagent eval` on doors neither the warm start
nor RL saw, at k = 1, 2, 4, 8: EM per objective (MEM1's metric), peak context tokens, tokens prefilled
and decoded per question, seconds per question, turns and the share answered.

Rooms: `sweep` (the build, the cells, the RL runs and the scorings), `records` (one record per cell,
read back to resume and report) and `report` (the tables and the plot). The command is
`benchmarks/papers_claim.py`; what it found and why it is built so: docs/papers_claim.md.
"""
