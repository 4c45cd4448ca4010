#!/usr/bin/env bash
# The one test command (CI runs exactly this): builds .venv from nothing, then ruff and pytest.
#   scripts/test.sh [--quick] [pytest args...]
# --quick leaves out the tests marked `slow` (verl's trainer, Ray, vLLM engines, recipe runs, heavy
# fixtures): the loop for editing, a few minutes. Without it, the full suite (tests/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
tier=()
if [ "${1:-}" = --quick ]; then
  tier=(-m "not slow")
  shift
fi
source scripts/setup.sh

ruff check .
ruff format --check .
# pytest exits 5 when it collects no test: that fails this script, as it should. -X faulthandler: a
# crash after the tests (a full run here once ended in a segmentation fault at interpreter exit, every
# test passed) prints every thread's Python stack instead of nothing.
# --durations: the slowest tests' times, so that a run's log says where CI's minutes go.
python -X faulthandler -m pytest --durations=40 "${tier[@]}" "$@"
