# Sourced by every recipe script: environment defaults, fail-fast checks and the verl launch.
#
# A recipe script sets its defaults and OVERRIDES (hydra overrides, one array item each), then calls
#   launch_main_ppo <config dir> <config name> "${OVERRIDES[@]}" "$@"
# Environment (defaults in brackets): MODEL_PATH, DATA_DIR (train.parquet, test.parquet),
# N_GPUS_PER_NODE [8], NNODES [1], MEMAGENT_RETRIEVER_URL [http://127.0.0.1:8000] (comma list for
# replicas), AGENT_LOOPS_YAML [the package's agent_loops.yaml], RAY_ADDRESS (set: submit to that
# Ray cluster with `ray job submit`), PYTHON [python3].
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

# Every comma-separated retriever URL must answer GET /health with status ready.
require_retriever() {
  local url urls
  IFS=',' read -r -a urls <<<"$1"
  for url in "${urls[@]}"; do
    "$PYTHON" - "$url" <<'PY' || die "retriever at $url is not healthy: start it (recipes/retriever/serve.sh) or set MEMAGENT_RETRIEVER_URL"
import json, sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1].rstrip("/") + "/health", timeout=5) as r:
        sys.exit(0 if json.load(r).get("status") == "ready" else 1)
except Exception:
    sys.exit(1)
PY
  done
}

launch_main_ppo() {
  local config_dir=$1 config_name=$2
  shift 2
  : "${MODEL_PATH:?set MODEL_PATH}" "${DATA_DIR:?set DATA_DIR}"
  N_GPUS_PER_NODE=${N_GPUS_PER_NODE:-8}
  NNODES=${NNODES:-1}
  MEMAGENT_RETRIEVER_URL=${MEMAGENT_RETRIEVER_URL:-http://127.0.0.1:8000}
  if [ -z "${AGENT_LOOPS_YAML:-}" ]; then
    # located without importing the package (which imports verl: seconds)
    AGENT_LOOPS_YAML=$("$PYTHON" -c "import importlib.util as u, pathlib as p
print(p.Path(u.find_spec('verl_memagent').origin).parent / 'agent' / 'agent_loops.yaml')") ||
      die "verl_memagent is not importable with $PYTHON: pip install verl-memagent (or set PYTHON)"
  fi
  local cmd=(
    "$PYTHON" -m verl.trainer.main_ppo --config-path="$config_dir" --config-name="$config_name"
    actor_rollout_ref.model.path="$MODEL_PATH"
    data.train_files="$DATA_DIR/train.parquet"
    data.val_files="$DATA_DIR/test.parquet"
    actor_rollout_ref.rollout.agent.agent_loop_config_path="$AGENT_LOOPS_YAML"
    trainer.n_gpus_per_node="$N_GPUS_PER_NODE"
    trainer.nnodes="$NNODES"
    "$@"
  )
  if [ -n "${RAY_ADDRESS:-}" ]; then
    # multi-node: the job's driver and workers get the retriever address through the runtime env
    cmd=(ray job submit --address "$RAY_ADDRESS" --no-wait
      --runtime-env-json "{\"env_vars\": {\"MEMAGENT_RETRIEVER_URL\": \"$MEMAGENT_RETRIEVER_URL\"}}" -- "${cmd[@]}")
  fi
  if [ "${MEMAGENT_DRY_RUN:-0}" = 1 ]; then
    printf '%s\n' "${cmd[@]}"
    return 0
  fi
  require_files "$DATA_DIR/train.parquet" "$DATA_DIR/test.parquet"
  require_retriever "$MEMAGENT_RETRIEVER_URL"
  export MEMAGENT_RETRIEVER_URL
  exec "${cmd[@]}"
}
