"""The password task composed, with doors no policy trained on: the papers' claim in miniature.

One question asks for the passwords of k doors ("Answer the following questions: What is the password
of station century at gate born?; What is ..."), composed by MEM1's `compose_multi_objective` and
scored by its sum-EM reward. Each door's password is stated in one passage, a 100-word passage of the
bundled Wikipedia corpus with the door's statement put in at a random sentence: wiki-18's passages are
100 words, and what a memory agent keeps of one (the statement) is a small part of what a full-history
agent keeps (the passage). So ReAct's context grows by a passage a search, a memory agent's by a line.

The doors come in six disjoint sets (`DoorSets`):
- `demos`: the warm start's scripted demonstrations (k from 1 to 8);
- `rl`: the questions MEM1's recipe (k = 2) trains on, 96 doors;
- `dev`: doors whose station and gate words the demonstrations use, never together; neither the warm
  start nor RL sees them. With `unseen`, the split every setting is chosen on (`held_out` until the test
  split existed: the committed records' `held_out` is this set);
- `unseen`: doors of station and gate words no training door uses: a second, harder dev column;
- `rl_pool`: 1,600 doors of words no other set uses (40 x 40, as the known grid), from which the papers'
  regime draws every RL question of a run, no door twice (`fresh_rl_rows`): remembering a door's password
  is worth nothing;
- `test`: 100 doors of words no other set uses, scored only for the final figures.

Rooms: `task` (the door sets, their corpus and questions, and the context lengths of the task's RL
recipe), `warm_start` (each agent's demonstrations and warm start; the three agents' warm starts at the
defaults are shipped in `starts/`) and `cli` (`python -m memagent_examples.composed_doors`). The sweep
that trains and scores the three agents on it is `memagent_examples.papers_claim` (docs/papers_claim.md).
"""
