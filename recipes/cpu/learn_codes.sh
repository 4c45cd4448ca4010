#!/usr/bin/env bash
# The learning demo: MemSearcher learns a search task on CPU within minutes (docs/learn_codes.md).
#   recipes/cpu/learn_codes.sh [hydra overrides...]
# Builds the password task (doors whose passwords only their own passage states, plus the bundled
# corpus as distractors) and its BM25 index once per set of inputs, cached under
# $MEMAGENT_CPU_CACHE/learn_codes/<key>. RL starts from the warm-started tiny model shipped in
# memagent_examples/learn_codes/start (the same policy on every machine); START=build builds one here
# instead (copy pretraining, then scripted MemSearcher demonstrations of other doors; cached too).
# Then starts the retriever and verl's real trainer (through the recipes' launcher, as run.sh does:
# N_GPUS_PER_NODE, NNODES and RAY_ADDRESS as there; the figures are of the default, one rank), and
# while the trainer starts scores the warm-started policy with `verl-memagent eval` on the task's
# questions (greedy EM, and sampled EM over $EVAL_SAMPLES samples) and on held-out doors it never
# trained on (greedy); prints one line per training step (reward, answered share, searches per
# trajectory, seconds), scores the trained policy the same way and saves reward_curve.png. The last
# line printed is one JSON object.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/preamble.sh" learn_codes
SEED=${SEED:-0}              # reinforcement learning: the order of the questions and the rollout's sampling
START=${START:-shipped}      # shipped: RL starts from memagent_examples/learn_codes/start; build: from one built here
BUILD_SEED=${BUILD_SEED:-0}  # START=build: the tiny model, the task and the warm start
COPY_STEPS=${COPY_STEPS:-800}  # START=build
WARM_STEPS=${WARM_STEPS:-200}  # START=build; benchmarks/warm_start_sweep.py: where the policy starts to be right (docs/learn_codes.md)
EVAL_SAMPLES=${EVAL_SAMPLES:-4}
# One torch thread per process (the scorings and builds run side by side, and torch's threads spin-waiting
# for each other made a warm-start step several times slower), but TRAINER_THREADS for verl's, whose
# trainer phases run alone (two were 1.5x faster once the CPU engine's operations were whole: docs/learn_codes.md).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
TRAINER_THREADS=${TRAINER_THREADS:-2}
AGENT_LOOPS=$HERE/learn_codes_agent_loops.yaml
CORPUS=$ROOT/data/corpus.jsonl

phase() { echo "== $* ($(date +%H:%M:%S))"; }
heartbeat() { # LABEL COMMAND...: run COMMAND; while it runs, say so every 20 s (the console never falls silent)
  local label=$1 start=$SECONDS next=20
  shift
  "$@" &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if ((SECONDS - start >= next)); then
      echo "  $label: running ($((SECONDS - start)) s)"
      next=$((next + 20))
    fi
  done
  wait "$pid"
}

SHIPPED=$ROOT/memagent_examples/learn_codes/start
case $START in
  shipped)  # the task of the seed the shipped start was built with: its demonstrations' doors are not the task's
    BUILD_SEED=$(python -c 'import json, sys; print(json.load(open(sys.argv[1]))["inputs"]["seed"])' "$SHIPPED/build.json")
    inputs=(--input start=shipped --input seed="$BUILD_SEED" --file "$SHIPPED/tokenizer.json")
    BUILT="the task and its BM25 index" TOKENIZER=$SHIPPED ;;
  build)
    inputs=(--input seed="$BUILD_SEED" --input copy_steps="$COPY_STEPS" --input warm_steps="$WARM_STEPS")
    BUILT="the tiny model, the task, its BM25 index and the warm start" ;;
  *) echo "START=$START: expected shipped or build" >&2; exit 2 ;;
esac
KEY=$(python -m memagent_examples.learn_codes.task build-key "${inputs[@]}" --file "$AGENT_LOOPS" --file "$CORPUS")
BUILD=$CACHE/learn_codes/$KEY
if [ "$START" = shipped ]; then POLICY=$SHIPPED; else TOKENIZER=$BUILD/model POLICY=$BUILD/model_warm; fi
mkdir -p "$CACHE/learn_codes"
exec 9>"$BUILD.lock"
flock 9  # two runs with the same inputs build once
if [ -f "$BUILD/complete" ]; then
  phase "$BUILT: reusing $BUILD (built once for these inputs)"
  start_retriever "$BUILD/bm25" "$WORK"
else
  rm -rf "$BUILD"
  phase "building $BUILT into $BUILD"
  if [ "$START" = build ]; then
    heartbeat "tiny model" verl-memagent tiny-model --out "$BUILD/model" --seed "$BUILD_SEED" >/dev/null
  fi
  heartbeat "task" python -m memagent_examples.learn_codes.task task --out "$BUILD/task" --tokenizer "$TOKENIZER" \
    --seed "$BUILD_SEED" --base-corpus "$CORPUS" >/dev/null
  heartbeat "BM25 index" python -m retriever_server build --kind bm25 --corpus "$BUILD/task/corpus.jsonl" \
    --out "$BUILD/bm25" >/dev/null
  start_retriever "$BUILD/bm25" "$WORK"
  if [ "$START" = build ]; then
    phase "warm start: copy pretraining ($COPY_STEPS steps), then demonstrations ($WARM_STEPS steps); cached for the next run"
    python -m memagent_examples.learn_codes.task warm-start --model "$BUILD/model" --out "$BUILD/model_warm" \
      --demos "$BUILD/task/demos.jsonl" --retriever "$MEMAGENT_RETRIEVER_URL" \
      --agent-loops "$AGENT_LOOPS" --copy-steps "$COPY_STEPS" --steps "$WARM_STEPS" --seed "$BUILD_SEED"
  fi
  touch "$BUILD/complete"
fi
flock -u 9
[ "$START" = build ] || phase "RL starts from the shipped warm start $SHIPPED (how it was built: its build.json)"

# EM of a policy: on the task's questions (the RL questions), greedy and sampled (the questions repeated as
# EVAL_SAMPLES datasets), and greedy on the held-out doors, whose station and gate words neither the warm
# start nor RL saw (8 passwords: chance 0.125), scored in the greedy run
EVALS=()
score_policy() { # NAME MODEL_DIR
  local eval=(verl-memagent eval --agent memsearcher --model "$2" --tokenizer "$TOKENIZER" \
    --agent-loops "$AGENT_LOOPS" --retriever "$MEMAGENT_RETRIEVER_URL" --prompt-length 512 --response-length 320)  # learn_codes.yaml's
  local samples=()
  for i in $(seq "$EVAL_SAMPLES"); do samples+=(--data "sample$i=$BUILD/task/qa.jsonl"); done
  phase "scoring the policy $1: the RL questions greedy and $EVAL_SAMPLES samples of each beside it, the held-out doors greedy"
  "${eval[@]}" --data "codes=$BUILD/task/qa.jsonl" --data "held_out=$BUILD/task/held_out.jsonl" \
    --out "$WORK/eval/$1_greedy" >/dev/null &
  local greedy=$!  # one torch thread each: the two runs take a core each
  # seeded draws (sampling_seed 0, whatever SEED): every run and machine scores a policy on the same samples
  heartbeat "scoring" "${eval[@]}" "${samples[@]}" --temperature 1 --set sampling_seed=0 \
    --out "$WORK/eval/$1_sampled" >/dev/null
  wait "$greedy"
  local summary=$WORK/eval/$1_greedy/summary.json
  local scored=(--eval "$1_greedy=$summary#codes" --eval "$1_sampled=$WORK/eval/$1_sampled/summary.json")
  scored+=(--eval "$1_held_out_greedy=$summary#held_out")
  python -m memagent_examples.learn_codes.reward_curve --print-em "${scored[@]}"
  EVALS+=("${scored[@]}")
}
rm -rf "$WORK/eval" "$WORK/checkpoints"
verl-memagent prepare --input "$BUILD/task/qa.jsonl" --agent memsearcher --out "$WORK/train.parquet" >/dev/null

# verl's trainer starts (Ray, its workers, the model: most of a minute, mostly on one core) while the
# starting policy is scored beside it; the step lines follow once the score is printed
phase "starting verl's trainer (details in $WORK/train.log)"
: >"$WORK/metrics.jsonl"
OMP_NUM_THREADS=$TRAINER_THREADS AGENT_LOOPS_YAML=$AGENT_LOOPS train_on_cpu learn_codes "$POLICY" data.seed="$SEED" actor_rollout_ref.rollout.seed="$SEED" \
  "$@" >"$WORK/train.log" 2>&1 &
TRAINER=$!
score_policy before_rl "$POLICY"
phase "reinforcement learning with verl's trainer: one line per step"
tail -n +1 -F --pid="$TRAINER" "$WORK/metrics.jsonl" 2>/dev/null | python -m memagent_examples.learn_codes.reward_curve --follow
wait "$TRAINER" || { tail -50 "$WORK/train.log" >&2; exit 1; }
verl-memagent show "$WORK/checkpoints" --steps first,last --out "$WORK/trajectories.html" >/dev/null &
SHOWING=$!  # the page of trajectories, written while the trained policy is scored

score_policy after_rl "$WORK/checkpoints/global_step_$(cat "$WORK/checkpoints/latest_checkpointed_iteration.txt")/actor/huggingface"
wait "$SHOWING"
echo "trajectories of the first and last step: $WORK/trajectories.html"
python -m memagent_examples.learn_codes.reward_curve "$WORK/metrics.jsonl" --png "$WORK/reward_curve.png" "${EVALS[@]}"
