#!/usr/bin/env bash
# The one test command (CI runs exactly this): builds .venv from nothing, then ruff and pytest.
# Idempotent: a second run reinstalls nothing unless pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=.venv
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"

stamp="$VENV/.installed-$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  python -m pip install -q -U pip
  # torch first, pinned to the CPU wheel: otherwise verl's dependency pulls a multi-GB CUDA build.
  python -m pip install -q torch==2.13.0
  python -m pip install -q -e ".[test]"
  rm -f "$VENV"/.installed-*
  touch "$stamp"
fi

ruff check .
ruff format --check .
# pytest exits 5 when it collects no test: that fails this script, as it should.
python -m pytest "$@"
