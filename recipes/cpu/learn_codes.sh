#!/usr/bin/env bash
# The main job on a laptop: MemSearcher learns a search task on CPU within minutes (docs/cpu.md).
#   recipes/cpu/learn_codes.sh [hydra overrides...]
# Writes the password task (doors whose passwords only their own passage states, plus the bundled
# corpus as distractors), builds its BM25 index, starts the retriever, warm-starts the tiny model
# (copy pretraining, then scripted MemSearcher demonstrations of other doors), scores it with
# `verl-memagent eval` on the task's questions (greedy EM, and sampled EM over $EVAL_SAMPLES samples),
# trains with verl's real trainer printing one line per step (reward, answered share, searches per
# trajectory, seconds), scores the trained policy the same way and saves reward_curve.png. The last
# line printed is one JSON object.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
WORK=$(mkdir -p "${WORK:-$ROOT/outputs/cpu/learn_codes}" && cd "${WORK:-$ROOT/outputs/cpu/learn_codes}" && pwd)
SEED=${SEED:-0}
COPY_STEPS=${COPY_STEPS:-800}
WARM_STEPS=${WARM_STEPS:-400}
EVAL_SAMPLES=${EVAL_SAMPLES:-4}

verl-memagent tiny-model --out "$WORK/model" --seed "$SEED" >/dev/null
python -m memagent_examples.learn_codes.task task --out "$WORK/task" --tokenizer "$WORK/model" --seed "$SEED" \
  --base-corpus "$ROOT/data/corpus.jsonl" >/dev/null
python -m retriever_server build --kind bm25 --corpus "$WORK/task/corpus.jsonl" --out "$WORK/bm25" >/dev/null

source "$HERE/retriever.sh"
start_retriever "$WORK/bm25" "$WORK"

python -m memagent_examples.learn_codes.task warm-start --model "$WORK/model" --out "$WORK/model_warm" \
  --demos "$WORK/task/demos.jsonl" --retriever "$MEMAGENT_RETRIEVER_URL" \
  --agent-loops "$HERE/learn_codes_agent_loops.yaml" --copy-steps "$COPY_STEPS" --steps "$WARM_STEPS" --seed "$SEED"
verl-memagent prepare --input "$WORK/task/qa.jsonl" --agent memsearcher --out "$WORK/train.parquet" >/dev/null

# EM of a policy on the task's questions, greedy and sampled (the questions repeated as EVAL_SAMPLES datasets)
EVALS=()
score_policy() { # NAME MODEL_DIR
  local eval=(verl-memagent eval --agent memsearcher --model "$2" --tokenizer "$WORK/model" \
    --agent-loops "$HERE/learn_codes_agent_loops.yaml" --retriever "$MEMAGENT_RETRIEVER_URL" \
    --prompt-length 1024 --response-length 384)
  local samples=()
  for i in $(seq "$EVAL_SAMPLES"); do samples+=(--data "sample$i=$WORK/task/qa.jsonl"); done
  "${eval[@]}" --data "codes=$WORK/task/qa.jsonl" --out "$WORK/eval/$1_greedy" >/dev/null
  "${eval[@]}" "${samples[@]}" --temperature 1 --out "$WORK/eval/$1_sampled" >/dev/null
  local scored=(--eval "$1_greedy=$WORK/eval/$1_greedy/summary.json" --eval "$1_sampled=$WORK/eval/$1_sampled/summary.json")
  python -m memagent_examples.learn_codes.reward_curve --print-em "${scored[@]}"
  EVALS+=("${scored[@]}")
}
rm -rf "$WORK/eval" "$WORK/checkpoints"
score_policy before_rl "$WORK/model_warm"

: >"$WORK/metrics.jsonl"
VERL_PLATFORM=cpu VERL_FILE_LOGGER_PATH="$WORK/metrics.jsonl" python -m verl.trainer.main_ppo \
  --config-path="$HERE" --config-name=learn_codes \
  actor_rollout_ref.model.path="$WORK/model_warm" \
  data.train_files="$WORK/train.parquet" \
  data.val_files="$WORK/train.parquet" \
  data.seed="$SEED" \
  actor_rollout_ref.rollout.agent.agent_loop_config_path="$HERE/learn_codes_agent_loops.yaml" \
  trainer.default_local_dir="$WORK/checkpoints" \
  "$@" >"$WORK/train.log" 2>&1 &
TRAINER=$!
echo "training: one line per step (details in $WORK/train.log)"
tail -n +1 -F --pid="$TRAINER" "$WORK/metrics.jsonl" 2>/dev/null | python -m memagent_examples.learn_codes.reward_curve --follow
wait "$TRAINER" || { tail -50 "$WORK/train.log" >&2; exit 1; }

score_policy after_rl "$WORK/checkpoints/global_step_$(cat "$WORK/checkpoints/latest_checkpointed_iteration.txt")/actor/huggingface"
python -m memagent_examples.learn_codes.reward_curve "$WORK/metrics.jsonl" --png "$WORK/reward_curve.png" "${EVALS[@]}"
