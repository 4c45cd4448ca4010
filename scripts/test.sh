#!/usr/bin/env bash
# The one test command (CI runs exactly this): builds .venv from nothing, then ruff and pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh

ruff check .
ruff format --check .
# pytest exits 5 when it collects no test: that fails this script, as it should.
python -m pytest "$@"
