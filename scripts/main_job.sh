#!/usr/bin/env bash
# The main job on its embedded default: builds .venv from nothing, then MemSearcher is trained by RL on
# the composed password task on CPU with verl's real trainer, and the papers' claim printed
# (recipes/cpu/main_job.sh, docs/main_job.md).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
exec recipes/cpu/main_job.sh "$@"
