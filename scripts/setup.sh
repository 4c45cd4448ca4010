# Sourced by scripts/test.sh and scripts/main_job.sh: builds .venv from nothing and activates it.
# Idempotent: a second run installs nothing unless pyproject.toml changed.

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
