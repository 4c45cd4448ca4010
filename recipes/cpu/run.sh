#!/usr/bin/env bash
# Train one agent recipe with verl's real trainer on CPU, end to end (docs/cpu.md):
#   recipes/cpu/run.sh memsearcher|mem1|react [hydra overrides...]
# Builds (once) the tiny model and the BM25 index of the bundled corpus, starts the retriever on a
# free loopback port, writes the training parquet, runs `python -m verl.trainer.main_ppo` with
# recipes/cpu/<agent>.yaml through the recipes' launcher (recipes/common/launch.sh) and stops the
# retriever. Outputs go to $WORK (default outputs/cpu/<agent>): metrics.jsonl (one line per step),
# checkpoints/, retriever.log. Topology as for the GPU recipes: N_GPUS_PER_NODE data-parallel ranks
# [1] on each of NNODES nodes [1], the run submitted to the Ray cluster at RAY_ADDRESS if set
# (recipes/cpu/ray_cluster.sh starts one on this machine); Ray's resources follow from them.
# AGENT_LOOPS_YAML [recipes/cpu/agent_loops.yaml]: the agent loops the run trains.
set -euo pipefail

AGENT=${1:?usage: recipes/cpu/run.sh memsearcher|mem1|react [hydra overrides...]}
shift
case "$AGENT" in
  memsearcher | react) PREPARE=(--limit 8) ;;
  mem1) PREPARE=(--objectives 2 --num-tasks 8) ;;
  *) echo "unknown agent '$AGENT': expected memsearcher, mem1 or react" >&2; exit 2 ;;
esac

source "$(dirname "${BASH_SOURCE[0]}")/preamble.sh" "$AGENT"
QA=${QA:-$ROOT/data/qa_multihop.jsonl}

[ -f "$CACHE/model/config.json" ] || verl-memagent tiny-model --out "$CACHE/model" >/dev/null
[ -f "$CACHE/bm25/meta.json" ] || python -m retriever_server build --kind bm25 --corpus "$ROOT/data/corpus.jsonl" \
  --out "$CACHE/bm25" >/dev/null

start_retriever "$CACHE/bm25" "$WORK"

verl-memagent prepare --input "$QA" --agent "$AGENT" --out "$WORK/train.parquet" --seed 0 "${PREPARE[@]}"
AGENT_LOOPS_YAML=${AGENT_LOOPS_YAML:-$HERE/agent_loops.yaml} train_on_cpu "$AGENT" "$CACHE/model" "$@"
