#!/usr/bin/env bash
# The main job on its embedded default: builds .venv from nothing, then MemSearcher learns the
# bundled password search task on CPU with verl's real trainer (recipes/cpu/learn_codes.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
exec recipes/cpu/learn_codes.sh "$@"
