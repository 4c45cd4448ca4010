"""The cpu platform and verl patches: active under VERL_PLATFORM=cpu only, each doing what it claims."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest
import ray
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM
from verl.workers.config import CheckpointEngineConfig, HFModelConfig, RolloutConfig

from verl_memagent.cpu import patches
from verl_memagent.cpu.hf_rollout import HFServer, HFServerAdapter, server_actor_name
from verl_memagent.cpu.register import cpu_path_problems


def _probe(code: str, **env: str) -> dict:
    """Run `code` in a fresh interpreter (verl resolves its platform once per process); last line is JSON."""
    base = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**base, **env}, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_patch_still_matches_the_verl_source_it_works_around():
    assert patches.check_targets() == []
    assert cpu_path_problems() == []


STALE_PROBE = """
import dataclasses, json
from verl_memagent.cpu import patches
# the first patch now expects text verl does not have, as after a verl upgrade that changed that line
patches.PATCHES = (dataclasses.replace(patches.PATCHES[0], expects="text verl does not contain"), *patches.PATCHES[1:])
import verl  # loads the plugin, which installs the patches under VERL_PLATFORM=cpu
import verl.utils.distributed as distributed
from verl.plugin.platform import get_platform
try:
    get_platform()
    platform_error = None
except ValueError as e:
    platform_error = str(e)
print(json.dumps({"installed": patches.installed(), "platform_error": platform_error,
                  "dist_wrapped": hasattr(distributed.initialize_global_process_group_ray, "__wrapped__")}))
"""


def test_a_stale_patch_stops_the_cpu_path_naming_both_verl_versions_and_patches_nothing():
    base = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    done = subprocess.run(
        [sys.executable, "-c", STALE_PROBE],
        capture_output=True,
        text=True,
        env={**base, "VERL_PLATFORM": "cpu"},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {**result, "installed": False, "dist_wrapped": False}  # not one patch applied
    assert "Unknown platform 'cpu'" in result["platform_error"]  # verl stops at once instead of running
    # the reason, logged in every process although verl hides a plugin's import error
    logged = next(line for line in done.stderr.splitlines() if "CPU patches" in line)
    assert f"verl {importlib.metadata.version('verl')} is installed" in logged
    assert f"written for verl {patches.VERL_VERSION}" in logged and f"verl=={patches.VERL_VERSION}" in logged
    assert "verl/utils/distributed.py:89: expected 'text verl does not contain'" in logged


DEFAULT_PROBE = """
import json, verl
from verl.plugin.platform import get_platform
import verl.utils.distributed as distributed
from verl.workers.engine.base import EngineRegistry
import verl.workers.engine.fsdp.transformer_impl as impl
from verl.workers.config import CheckpointEngineConfig, HFModelConfig, RolloutConfig

from verl_memagent.cpu import patches
engines = EngineRegistry._engines["language_model"]["fsdp2"]
print(json.dumps({"platform": type(get_platform()).__name__, "patched": patches.installed(),
                  "cpu_engine": "cpu" in engines,
                  "dist_wrapped": hasattr(distributed.initialize_global_process_group_ray, "__wrapped__"),
                  "offload": impl.CPUOffloadPolicy.__name__}))
"""


def test_without_verl_platform_nothing_changes():
    result = _probe(DEFAULT_PROBE)
    assert result["platform"] != "PlatformCPU"  # auto-detection never picks cpu
    assert result == {**result, "patched": False, "cpu_engine": False, "dist_wrapped": False}
    assert result["offload"] == "CPUOffloadPolicy"


CPU_PROBE = """
import json, os, socket, verl
import torch, torch.distributed as dist
from verl.utils.device import get_device_name, get_torch_device, get_device_id
from verl.utils.distributed import initialize_global_process_group_ray
from verl.workers.engine.base import EngineRegistry
import verl.workers.engine.fsdp.transformer_impl as impl
device = get_torch_device()
state = device.get_rng_state(); a = torch.rand(3); device.set_rng_state(state); b = torch.rand(3)
free, total = device.mem_get_info()
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
initialize_global_process_group_ray()  # verl's own call, as its engine workers make it
try:
    EngineRegistry.get_engine_cls("language_model", "fsdp")
    fsdp1 = "registered"
except (ValueError, AssertionError) as e:
    fsdp1 = str(e)
print(json.dumps({"device": get_device_name(), "device_id": get_device_id(), "rng_restored": a.tolist() == b.tolist(),
                  "memory": 0 < free <= total and device.max_memory_allocated() > 0, "backend": dist.get_backend(),
                  "fsdp2": EngineRegistry.get_engine_cls("language_model", "fsdp2").__name__, "fsdp1": fsdp1,
                  "pinned": impl.CPUOffloadPolicy(pin_memory=True).pin_memory}))
"""


def test_cpu_platform_and_patches_make_verls_own_calls_work():
    result = _probe(CPU_PROBE, VERL_PLATFORM="cpu")
    assert result["device"] == "cpu" and result["device_id"] == "cpu"
    assert result["rng_restored"] and result["memory"]
    assert result["backend"] == "cpu:gloo"
    assert result["fsdp2"] == "CPUEngineWithLMHead"  # verl's, with the head at response positions only
    assert "No engine registered for device='cpu'" in result["fsdp1"]  # FSDP1 stays refused, clearly
    assert result["pinned"] is False


def _transfer_queue_conf(storage_units: int):
    return OmegaConf.create(
        {"backend": {"storage_backend": "SimpleStorage", "SimpleStorage": {"num_data_storage_units": storage_units}}}
    )


def test_too_few_ray_cpus_is_a_clear_error(local_ray):
    # controller 1 + storage units + 3 per trainer worker x 1 logical GPU + 1 to place the other actors
    with pytest.raises(RuntimeError, match=r"Ray has 8 logical CPUs but this run holds 13 .*num_cpus=13"):
        patches.require_ray_cpus(_transfer_queue_conf(storage_units=8))
    patches.require_ray_cpus(_transfer_queue_conf(storage_units=1))


async def test_adapter_streams_full_weights_into_the_server_in_buckets(local_ray, tiny_model_dir, tokenizer):
    config = RolloutConfig(
        name="hf",
        tensor_model_parallel_size=1,
        prompt_length=64,
        response_length=8,
        dtype="float32",
        checkpoint_engine=CheckpointEngineConfig(update_weights_bucket_megabytes=1),  # 6 MB model: several calls
    )
    model_config = OmegaConf.create({"path": str(tiny_model_dir)})  # raw, as verl hands it to replicas
    server = ray.remote(HFServer).options(name=server_actor_name(0)).remote(config, model_config, 0)
    adapter = HFServerAdapter(config, HFModelConfig(path=str(tiny_model_dir)), None, replica_rank=0)

    trained = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    torch.manual_seed(1)
    for p in trained.parameters():
        p.data.add_(torch.randn_like(p) * 0.5)
    prompt = tokenizer("<question> who wrote it </question>")["input_ids"]
    greedy = {"temperature": 0, "ignore_eos": True}
    before = await server.generate.remote(prompt, greedy, "a")
    await adapter.update_weights(iter(trained.state_dict().items()), global_steps=5)
    after = await server.generate.remote(prompt, greedy, "b")

    expected = trained.generate(torch.tensor([prompt]), max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert after.token_ids == expected[0, len(prompt) :].tolist() != before.token_ids
    assert after.extra_fields["global_steps"] == 5
    assert len(after.token_ids) == 8  # no max_tokens given: the server's default is response_length
