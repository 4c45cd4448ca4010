# Sourced by every recipe script (the CPU ones through recipes/cpu/preamble.sh): environment defaults,
# fail-fast checks and the verl launch.
#
# A recipe script sets its defaults and OVERRIDES (hydra overrides, one array item each), then calls
#   launch_main_ppo <config dir> <config name> "${OVERRIDES[@]}" "$@"
# Environment (defaults in brackets): MODEL_PATH, DATA_DIR (train.parquet, test.parquet),
# N_GPUS_PER_NODE [8], NNODES [1], MEMAGENT_RETRIEVER_URL [http://127.0.0.1:8000] (comma list for
# replicas), AGENT_LOOPS_YAML [the package's agent_loops.yaml], PYTHON [python3], and
#   RAY_ADDRESS   set: submit the run to that Ray cluster with `ray job submit`, stream its log and exit
#                 with its outcome; the job gets every MEMAGENT_* and VERL_* variable of this shell
#                 (the retriever address among them) and absolute paths;
#   VERL_PLATFORM=cpu  run on CPU cores (docs/cpu.md): recipes/cpu/cpu.yaml is composed on top of the
#                 recipe, and Ray's logical CPUs and GPUs are derived from N_GPUS_PER_NODE and NNODES
#                 (and, under separate_async, the rollout replicas' sizes among the overrides).
# With MEMAGENT_DRY_RUN=1 the command is printed, one argument per line, instead of run, and nothing
# is checked: tests/recipes composes exactly these arguments with hydra and validates them.

RECIPES_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}

die() {
  echo "recipe: $*" >&2
  exit 1
}

require_files() {
  local f
  for f in "$@"; do
    [ -f "$f" ] || die "data file $f is missing: prepare it with 'verl-memagent prepare' (recipes/README.md) or set DATA_DIR"
  done
}

# Every comma-separated retriever URL must answer GET /health: verl_memagent/search/endpoint.py's probe
# and rule (ready, or degraded while a search process restarts), which prints the URLs that do not.
require_retriever() {
  "$PYTHON" -m verl_memagent.search.endpoint "$1" ||
    die "a retriever does not answer: start it (recipes/retriever/serve.sh) or set MEMAGENT_RETRIEVER_URL"
}

# A path that exists here, made absolute: a submitted job does not run in this directory.
# Anything else (a hub model id) is kept as it is.
absolute_path() {
  if [ -e "$1" ]; then
    (cd "$(dirname "$1")" && echo "$(pwd)/$(basename "$1")")
  else
    echo "$1"
  fi
}

launch_main_ppo() {
  local config_dir=$1 config_name=$2
  shift 2
  : "${MODEL_PATH:?set MODEL_PATH}" "${DATA_DIR:?set DATA_DIR}"
  N_GPUS_PER_NODE=${N_GPUS_PER_NODE:-8}
  NNODES=${NNODES:-1}
  MEMAGENT_RETRIEVER_URL=${MEMAGENT_RETRIEVER_URL:-$("$PYTHON" -c \
    'from verl_memagent.search.endpoint import DEFAULT_RETRIEVER_URL; print(DEFAULT_RETRIEVER_URL)')}
  if [ -z "${AGENT_LOOPS_YAML:-}" ]; then
    # located without importing the package (which imports verl: seconds)
    AGENT_LOOPS_YAML=$("$PYTHON" -c "import importlib.util as u, pathlib as p
print(p.Path(u.find_spec('verl_memagent').origin).parent / 'agent' / 'agent_loops.yaml')") ||
      die "verl_memagent is not importable with $PYTHON: pip install verl-memagent (or set PYTHON)"
  fi
  local model_path data_dir
  model_path=$(absolute_path "$MODEL_PATH")
  data_dir=$(absolute_path "$DATA_DIR")
  local platform=()
  if [ "${VERL_PLATFORM:-}" = cpu ]; then
    # the CPU recipes (recipes/cpu/*.yaml) compose cpu.yaml themselves; any other recipe gets it last
    [ "$config_dir" -ef "$RECIPES_DIR/cpu" ] ||
      platform=("hydra.searchpath=[pkg://verl.trainer.config,file://$RECIPES_DIR]" "+cpu@_global_=cpu")
    local resources
    # the overrides say whether rollout replicas of their own (separate_async) need logical GPUs too
    resources=$("$PYTHON" -m verl_memagent.cpu.topology hydra --n-gpus-per-node "$N_GPUS_PER_NODE" \
      --nnodes "$NNODES" ${RAY_ADDRESS:+--cluster} -- "$@") ||
      die "N_GPUS_PER_NODE and NNODES must be whole numbers >= 1, the rollout replicas' sizes too (above)"
    mapfile -t -O "${#platform[@]}" platform <<<"$resources"
  fi
  local cmd=(
    "$PYTHON" -m verl.trainer.main_ppo --config-path="$config_dir" --config-name="$config_name"
    "${platform[@]}"
    actor_rollout_ref.model.path="$model_path"
    data.train_files="$data_dir/train.parquet"
    data.val_files="$data_dir/test.parquet"
    actor_rollout_ref.rollout.agent.agent_loop_config_path="$(absolute_path "$AGENT_LOOPS_YAML")"
    trainer.n_gpus_per_node="$N_GPUS_PER_NODE"
    trainer.nnodes="$NNODES"
    "$@"
  )
  export MEMAGENT_RETRIEVER_URL
  if [ -n "${RAY_ADDRESS:-}" ]; then
    # multi-node: the driver runs on the cluster; it and every worker see this shell's MEMAGENT_* and
    # VERL_* variables. Without --no-wait, `ray job submit` streams the job's log and exits 1 if it failed.
    local runtime_env
    runtime_env=$("$PYTHON" -c 'import json, os
print(json.dumps({"env_vars": {k: v for k, v in os.environ.items() if k.startswith(("MEMAGENT_", "VERL_"))}}))')
    cmd=(ray job submit --address "$RAY_ADDRESS" --runtime-env-json "$runtime_env" -- "${cmd[@]}")
  fi
  if [ "${MEMAGENT_DRY_RUN:-0}" = 1 ]; then
    printf '%s\n' "${cmd[@]}"
    return 0
  fi
  require_files "$data_dir/train.parquet" "$data_dir/test.parquet"
  require_retriever "$MEMAGENT_RETRIEVER_URL"
  "${cmd[@]}"
}
