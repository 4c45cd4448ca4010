# Sourced by the CPU recipe scripts (run.sh, learn_codes.sh) after `set -euo pipefail`:
#   source "$(dirname "${BASH_SOURCE[0]}")/preamble.sh" NAME
# Sets HERE (recipes/cpu), ROOT (the repository), WORK (this run's outputs: $WORK, default
# outputs/cpu/NAME) and CACHE (what runs share and build once: $MEMAGENT_CPU_CACHE, default
# outputs/cpu/cache), all absolute and created; brings start_retriever (retriever.sh) and the recipes'
# launcher (recipes/common/launch.sh), through which train_on_cpu runs verl's trainer.

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
WORK=$(mkdir -p "${WORK:-$ROOT/outputs/cpu/$1}" && cd "${WORK:-$ROOT/outputs/cpu/$1}" && pwd)
CACHE=$(mkdir -p "${MEMAGENT_CPU_CACHE:-$ROOT/outputs/cpu/cache}" && cd "${MEMAGENT_CPU_CACHE:-$ROOT/outputs/cpu/cache}" && pwd)
source "$HERE/retriever.sh"
source "$HERE/../common/launch.sh"

# train_on_cpu CONFIG_NAME MODEL_DIR [hydra overrides...]: verl's trainer with recipes/cpu/CONFIG_NAME.yaml
# on CPU (launch_main_ppo with VERL_PLATFORM=cpu) on the questions of $WORK/train.parquet, validated on
# the questions of VAL_DATA (a parquet) if set, else on the same questions ($WORK/test.parquet is a
# copy): what the run learned on its own questions. Metrics to $WORK/metrics.jsonl (one line per step), checkpoints to $WORK/checkpoints;
# N_GPUS_PER_NODE data-parallel ranks [1] on each of NNODES nodes [1], submitted to RAY_ADDRESS if set.
# The agent loops: AGENT_LOOPS_YAML.
train_on_cpu() {
  local config=$1 model=$2
  shift 2
  cp "${VAL_DATA:-$WORK/train.parquet}" "$WORK/test.parquet"
  VERL_PLATFORM=cpu VERL_FILE_LOGGER_PATH="$WORK/metrics.jsonl" MODEL_PATH=$model DATA_DIR=$WORK \
    N_GPUS_PER_NODE=${N_GPUS_PER_NODE:-1} PYTHON=python launch_main_ppo "$HERE" "$config" \
    trainer.default_local_dir="$WORK/checkpoints" "$@"
}
