#!/usr/bin/env bash
# Serve one index for the rollouts: INDEX [$HOME/indexes/e5] HOST [127.0.0.1] PORT [8000].
# Extra arguments go to `python -m retriever_server serve` (e.g. --device cuda --topk-max 10).
# On a cluster, bind an interface the rollout nodes reach (HOST=0.0.0.0 on a private network only)
# and set --token-env so that only your jobs can query it.
set -euo pipefail
PYTHON=${PYTHON:-python3}
exec "$PYTHON" -m retriever_server serve --index "${INDEX:-$HOME/indexes/e5}" \
  --host "${HOST:-127.0.0.1}" --port "${PORT:-8000}" "$@"
