#!/usr/bin/env bash
# Train one agent recipe with verl's real trainer on CPU, end to end (docs/cpu.md):
#   recipes/cpu/run.sh memsearcher|mem1|react [hydra overrides...]
# Builds (once) the tiny model and the BM25 index of the bundled corpus, starts the retriever on a
# free loopback port, writes the training parquet, runs `python -m verl.trainer.main_ppo` with
# recipes/cpu/<agent>.yaml and stops the retriever. Outputs go to $WORK (default outputs/cpu/<agent>):
# metrics.jsonl (one line per step), checkpoints/, retriever.log.
set -euo pipefail

AGENT=${1:?usage: recipes/cpu/run.sh memsearcher|mem1|react [hydra overrides...]}
shift
case "$AGENT" in
  memsearcher | react) PREPARE=(--limit 8) ;;
  mem1) PREPARE=(--objectives 2 --num-tasks 8) ;;
  *) echo "unknown agent '$AGENT': expected memsearcher, mem1 or react" >&2; exit 2 ;;
esac

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
WORK=$(mkdir -p "${WORK:-$ROOT/outputs/cpu/$AGENT}" && cd "${WORK:-$ROOT/outputs/cpu/$AGENT}" && pwd)
CACHE=$(mkdir -p "${MEMAGENT_CPU_CACHE:-$ROOT/outputs/cpu/cache}" && cd "${MEMAGENT_CPU_CACHE:-$ROOT/outputs/cpu/cache}" && pwd)
QA=${QA:-$ROOT/data/qa_multihop.jsonl}

[ -f "$CACHE/model/config.json" ] || verl-memagent tiny-model --out "$CACHE/model" >/dev/null
[ -f "$CACHE/bm25/meta.json" ] || python -m retriever_server build --kind bm25 --corpus "$ROOT/data/corpus.jsonl" \
  --out "$CACHE/bm25" >/dev/null

source "$HERE/retriever.sh"
start_retriever "$CACHE/bm25" "$WORK"

verl-memagent prepare --input "$QA" --agent "$AGENT" --out "$WORK/train.parquet" --seed 0 "${PREPARE[@]}"

VERL_PLATFORM=cpu VERL_FILE_LOGGER_PATH="$WORK/metrics.jsonl" python -m verl.trainer.main_ppo \
  --config-path="$HERE" --config-name="$AGENT" \
  actor_rollout_ref.model.path="$CACHE/model" \
  data.train_files="$WORK/train.parquet" \
  data.val_files="$WORK/train.parquet" \
  actor_rollout_ref.rollout.agent.agent_loop_config_path="$HERE/agent_loops.yaml" \
  trainer.default_local_dir="$WORK/checkpoints" \
  "$@"
