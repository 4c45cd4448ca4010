"""vLLM on the CPU path: verl finds vllm-cpu's version, vLLM loads this package's plugin, and the plugin
keeps vLLM-CPU's linear weights reloadable as verl's weight sync needs; the recipes take the backend
as a choice. The training runs through verl's vLLM rollout are in test_recipes_cpu.py.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from verl.utils.config import omega_conf_to_dataclass
from vllm_cpu import require_vllm_cpu

from verl_memagent import doctor
from verl_memagent.cpu import patches, vllm_plugin

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def _vllm_cpu_installed():
    require_vllm_cpu()


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter (vLLM resolves its platform and loads its plugins once per process)."""
    base = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    command = [sys.executable, "-c", code]
    return subprocess.run(command, capture_output=True, text=True, env={**base, **env}, timeout=600)


def test_the_plugin_fits_the_installed_vllm_and_verl():
    assert vllm_plugin.check_targets() == []
    assert f'"vllm-cpu=={vllm_plugin.VLLM_VERSION};' in (ROOT / "pyproject.toml").read_text()  # the pinned one
    assert "memagent_cpu" in importlib.metadata.entry_points(group="vllm.general_plugins").names


RELOAD_PROBE = """
import json, os, torch
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.distributed import init_distributed_environment, initialize_model_parallel
from vllm.model_executor.layers.linear import ReplicatedLinear

def load_then_sync():
    # a vLLM linear layer on the CPU platform: the model's load, then a weight sync as verl makes it
    # (the parameter's weight_loader, then process_weights_after_loading again)
    layer = ReplicatedLinear(64, 32, bias=False, params_dtype=torch.float32)
    x = torch.randn(3, 64)
    for _ in range(2):
        weight = torch.randn(32, 64)
        try:
            layer.weight.weight_loader(layer.weight, weight)
        except AttributeError as error:
            return {"error": str(error)}
        layer.quant_method.process_weights_after_loading(layer)
    return {"gap": (layer(x)[0] - x @ weight.T).abs().max().item()}

with set_current_vllm_config(VllmConfig()):
    init_distributed_environment(1, 0, "tcp://127.0.0.1:%d" % PORT, 0, backend="gloo")
    initialize_model_parallel(1, 1)
    without = load_then_sync()
    os.environ["VERL_PLATFORM"] = "cpu"
    from vllm.plugins import load_general_plugins
    load_general_plugins()  # vLLM's own loader runs the entry points of vllm.general_plugins
    from verl_memagent.cpu import vllm_plugin
    print(json.dumps({"without": without, "with": load_then_sync(), "registered": vllm_plugin.registered()}))
"""


@pytest.mark.slow  # a vLLM engine starts
def test_the_plugin_makes_a_vllm_cpu_linear_layer_take_synced_weights(unused_tcp_port):
    done = _run(RELOAD_PROBE.replace("PORT", str(unused_tcp_port)))
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # vLLM-CPU alone drops the parameter after packing it: what the plugin exists for. When a vLLM
    # release keeps it, this fails: the plugin can go.
    assert result["without"] == {"error": "'Parameter' object has no attribute 'weight_loader'"}
    assert result["registered"] and result["with"]["gap"] < 1e-4  # computes with the synced weight


@pytest.fixture
def unused_tcp_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_plugin_does_nothing_off_the_cpu_path(monkeypatch):
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    monkeypatch.setattr(vllm_plugin, "_registered", False)
    vllm_plugin.register()
    assert not vllm_plugin.registered()


def test_a_stale_plugin_target_stops_vllm_naming_both_versions(monkeypatch):
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    monkeypatch.setattr(vllm_plugin, "_registered", False)
    stale = dataclasses.replace(vllm_plugin.PATCHES[0], expects="text vLLM does not contain")
    monkeypatch.setattr(vllm_plugin, "PATCHES", (stale,))
    with pytest.raises(patches.StalePatchError) as raised:
        vllm_plugin.register()
    message = str(raised.value)
    assert f"vllm-cpu {importlib.metadata.version('vllm-cpu')} is installed" in message
    assert f"vllm-cpu=={vllm_plugin.VLLM_VERSION}" in message
    assert "linear.py:214-216: expected 'text vLLM does not contain'" in message
    assert not vllm_plugin.registered()


def test_vllm_cpu_is_found_as_vllm_with_a_cpu_version():
    finder = patches.VllmCpuAsVllm()
    found = list(finder.find_distributions(importlib.metadata.DistributionFinder.Context(name="vllm")))
    cpu_version = importlib.metadata.version("vllm-cpu") + "+cpu"
    assert [(d.metadata["Name"], d.version) for d in found] == [("vllm", cpu_version)]
    assert found[0].entry_points == importlib.metadata.distribution("vllm-cpu").entry_points
    for other in (None, "vllm-cpu", "torch"):
        assert list(finder.find_distributions(importlib.metadata.DistributionFinder.Context(name=other))) == []


def test_without_the_finder_verl_does_not_find_vllm_cpu(monkeypatch):
    """What the patch is for: verl's module refuses vllm-cpu when the lookup is left as it is."""
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, patches.VllmCpuAsVllm)])
    monkeypatch.delitem(sys.modules, "verl.third_party.vllm", raising=False)
    with pytest.raises(ValueError, match="vllm version None not supported"):
        importlib.import_module("verl.third_party.vllm")


@pytest.mark.slow  # imports vLLM in a fresh process
def test_doctor_reports_the_vllm_stack_on_the_cpu_path():
    done = _run("import sys\nfrom verl_memagent.cli import main\nsys.exit(main(['doctor']))", VERL_PLATFORM="cpu")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    rows = {line[:28].strip(): line[28:].strip() for line in done.stdout.splitlines()}
    assert rows["vllm"] == f"{importlib.metadata.version('vllm-cpu')} (vllm-cpu, CPU build)"
    assert rows["vllm platform"] == "cpu"
    assert rows["vllm version for verl"] == importlib.metadata.version("vllm-cpu") + "+cpu"
    assert rows["vllm plugin"] == "loaded by vLLM (reloadable CPU linear weights)"


def test_doctor_fails_on_cuda_add_ons_next_to_cpu_torch(monkeypatch):
    versions = {"torchvision": "0.28.0", "torchaudio": "2.11.1+cpu"}
    monkeypatch.setattr(doctor, "_version", versions.get)
    assert doctor.cuda_add_ons() == ["torchvision 0.28.0"]


@pytest.mark.parametrize("recipe", ["memsearcher", "mem1", "react", "learn_codes"])
@pytest.mark.parametrize("backend", ["hf", "vllm"])
def test_the_rollout_backend_is_a_recipe_choice(recipe, backend):
    with initialize_config_dir(config_dir=str(ROOT / "recipes" / "cpu"), version_base=None):
        config = compose(config_name=recipe, overrides=[f"rollout_backend={backend}"])
    rollout = omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
    assert rollout.name == backend
    if backend == "vllm":
        assert not rollout.enable_sleep_mode and rollout.enforce_eager
        assert rollout.engine_kwargs["vllm"]["kv_cache_memory_bytes"] > 0
