#!/usr/bin/env bash
# The main job (docs/main_job.md): MemSearcher trained by RL in the papers' regime on the composed password
# task, from its shipped warm start, and the papers' claim shown: test EM and peak context at k = 1, 2, 4, 8
# before and after RL, beside ReAct's from the committed sweep.
#   recipes/cpu/main_job.sh [hydra overrides of composed_doors_fresh.yaml...]     SEED=0 WORK=outputs/cpu/main_job
# The machinery is memagent_examples.papers_claim.main_job; RL starts through recipes/cpu/composed_doors.sh
# as every composed run (train_on_cpu, recipes/common/launch.sh). The last line printed is one JSON object.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/preamble.sh" main_job
# One torch thread per scoring process; verl's at TRAINER_THREADS (composed_doors.sh; docs/learn_codes.md).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# The test split is scored before and after RL: no validation passes while it trains.
exec python -m memagent_examples.papers_claim.main_job --work "$WORK" --seed "${SEED:-0}" \
  trainer.val_before_train=false trainer.test_freq=-1 "$@"
