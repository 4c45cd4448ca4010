"""Ray's resources for a CPU run are derived from its topology, the way the launchers ask for them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from verl_memagent.cpu.topology import (
    CPUS_PER_TRAINER_WORKER,
    STORAGE_UNITS,
    Topology,
    hydra_overrides,
    ray_cpus_needed,
    storage_units_of,
)

CPU_YAML = Path(__file__).resolve().parents[2] / "recipes" / "cpu" / "cpu.yaml"


def test_cpus_per_worker_is_verls_placement_bundle():
    from verl.single_controller.ray.base import ResourcePoolManager

    assert ResourcePoolManager.max_colocate_count == CPUS_PER_TRAINER_WORKER


@pytest.mark.parametrize(
    ("n_gpus_per_node", "nnodes", "local_cpus", "node_cpus"),
    # controller 1 + storage 1 + 3 per worker + 1 free; a node of a cluster counts only its own workers
    [(1, 1, 6, 6), (2, 1, 9, 9), (8, 1, 27, 27), (1, 2, 9, 6), (2, 2, 15, 9)],
)
def test_resources_by_hand(n_gpus_per_node, nnodes, local_cpus, node_cpus):
    topology = Topology(n_gpus_per_node, nnodes)
    assert topology.ranks == n_gpus_per_node * nnodes
    assert topology.local_ray() == {"num_cpus": local_cpus, "num_gpus": n_gpus_per_node * nnodes}
    assert topology.node() == {"num_cpus": node_cpus, "num_gpus": n_gpus_per_node}
    # the nodes of a cluster hold at least what one local Ray of the same ranks would
    assert topology.node()["num_cpus"] * nnodes >= topology.local_ray()["num_cpus"]
    assert ray_cpus_needed(2, storage_units=8) == 1 + 8 + 6 + 1


def test_cpu_yaml_asks_ray_for_its_topologys_budget():
    """recipes/cpu/cpu.yaml writes Ray's resources out (a run without the launcher reads them there):
    they are the budget of the topology and storage units it sets."""
    cpu = OmegaConf.load(CPU_YAML)
    assert cpu.transfer_queue.backend.SimpleStorage.num_data_storage_units == STORAGE_UNITS
    topology = Topology(cpu.trainer.n_gpus_per_node, cpu.trainer.nnodes, STORAGE_UNITS)
    assert dict(cpu.ray_kwargs.ray_init) == topology.local_ray()


def test_storage_units_are_read_from_the_transfer_queue_section():
    def section(backend: str, units: int):
        return OmegaConf.create(
            {"backend": {"storage_backend": backend, "SimpleStorage": {"num_data_storage_units": units}}}
        )

    assert storage_units_of(section("SimpleStorage", 3)) == 3
    assert storage_units_of(section("Yuanrong", 3)) == 0  # another backend holds no SimpleStorage actors


def test_hydra_overrides_local_and_in_a_cluster():
    assert hydra_overrides(Topology(2), cluster=False) == [
        "ray_kwargs.ray_init.num_cpus=9",
        "ray_kwargs.ray_init.num_gpus=2",
    ]
    # ray.init refuses resources when it joins a running cluster: the nodes declared theirs
    assert hydra_overrides(Topology(1, 2), cluster=True) == [
        "ray_kwargs.ray_init.num_cpus=null",
        "ray_kwargs.ray_init.num_gpus=null",
    ]


def test_command_line_and_its_errors():
    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "verl_memagent.cpu.topology", *args], capture_output=True, text=True
        )

    done = run("ray-start", "--n-gpus-per-node", "2")
    assert done.returncode == 0 and done.stdout.split() == ["--num-cpus=9", "--num-gpus=2"]
    done = run("hydra", "--n-gpus-per-node", "0")
    assert done.returncode == 2 and "n_gpus_per_node must be at least 1, got 0" in done.stderr
    # the launchers call it before every run: it loads neither verl nor torch
    probe = "import sys, verl_memagent.cpu.topology; print(sorted({'verl', 'torch', 'ray'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip() == "[]"
