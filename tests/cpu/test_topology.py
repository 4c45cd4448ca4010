"""Ray's resources for a CPU run are derived from its topology, the way the launchers ask for them."""

from __future__ import annotations

import inspect
import re
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
    standalone_rollout_ranks,
    storage_units_of,
)
from verl_memagent.recipe_check import compose, dry_run

REPO = Path(__file__).resolve().parents[2]
CPU_YAML = REPO / "recipes" / "cpu" / "cpu.yaml"
#: what a separate_async run on CPU sets besides its trainer mode (docs/async.md): one replica of one rank
SEPARATE_ASYNC = [
    "trainer.v1.trainer_mode=memagent_separate_async",
    "actor_rollout_ref.hybrid_engine=False",
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
]


def test_cpus_per_worker_is_verls_placement_bundle():
    from verl.single_controller.ray.base import ResourcePoolManager
    from verl.workers.rollout.replica import RolloutReplica

    assert ResourcePoolManager.max_colocate_count == CPUS_PER_TRAINER_WORKER
    # a rollout replica of its own reserves fewer per rank, and is counted at the trainer workers' bundle
    replica_bundle = re.findall(r"max_colocate_count=(\d+)", inspect.getsource(RolloutReplica.init_standalone))
    assert [int(cpus) for cpus in replica_bundle] == [2] and 2 <= CPUS_PER_TRAINER_WORKER


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
    resources = {key: cpu.ray_kwargs.ray_init[key] for key in ("num_cpus", "num_gpus")}
    assert resources == topology.local_ray()


def test_rollout_replicas_of_their_own_are_counted_under_separate_async_only():
    assert standalone_rollout_ranks(SEPARATE_ASYNC, n_gpus_per_node=1) == 1
    # verl's rollout.n_gpus_per_node defaults to the trainer's; the last override of a key wins, as in hydra
    two_nodes = ["+trainer.v1.trainer_mode=separate_async", "actor_rollout_ref.rollout.nnodes=2"]
    assert standalone_rollout_ranks(two_nodes, n_gpus_per_node=2) == 4
    assert standalone_rollout_ranks([*two_nodes, "actor_rollout_ref.rollout.nnodes=1"], n_gpus_per_node=2) == 2
    # colocated modes run their replicas on the trainer's ranks; separate_async without nnodes: verl refuses it
    for mode in ("memagent_sync", "memagent_colocate_async"):
        assert standalone_rollout_ranks([*SEPARATE_ASYNC, f"trainer.v1.trainer_mode={mode}"], 1) == 0
    assert standalone_rollout_ranks(["trainer.v1.trainer_mode=separate_async"], n_gpus_per_node=1) == 0
    with pytest.raises(ValueError, match=r"actor_rollout_ref.rollout.nnodes=\$\{x\}: .* whole number"):
        standalone_rollout_ranks([*SEPARATE_ASYNC, "actor_rollout_ref.rollout.nnodes=${x}"], 1)
    assert Topology(1, rollout_ranks=1).local_ray() == {"num_cpus": 9, "num_gpus": 2}


def test_the_launcher_asks_ray_for_the_replicas_of_separate_async(tmp_path):
    """What the CPU recipes hand verl for a separate_async run, composed as main_ppo composes it: Ray's
    resources are the budget of the composed config's trainer ranks and rollout replicas' ranks."""
    harness = tmp_path / "train.sh"
    harness.write_text(
        "set -euo pipefail\n"
        f'source "{REPO}/recipes/cpu/preamble.sh" memsearcher\n'
        'touch "$WORK/train.parquet"\n'  # a dry run reads no data
        'train_on_cpu memsearcher "$MODEL" "$@"\n'
    )
    for overrides, replicas in ((SEPARATE_ASYNC, 1), ([], 0)):
        env = {"WORK": str(tmp_path / "work"), "MEMAGENT_CPU_CACHE": str(tmp_path / "cache"), "MODEL": "model"}
        launch = dry_run(harness, env, overrides)
        config = compose(launch)
        rollout = config.actor_rollout_ref.rollout
        ranks = rollout.nnodes * rollout.n_gpus_per_node if replicas else 0
        topology = Topology(config.trainer.n_gpus_per_node, config.trainer.nnodes, rollout_ranks=ranks)
        ray_init = config.ray_kwargs.ray_init  # verl's other ray.init settings beside these
        assert ranks == replicas and {name: ray_init[name] for name in ("num_cpus", "num_gpus")} == topology.local_ray()


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
    done = run("hydra", "--n-gpus-per-node", "1", "--", *SEPARATE_ASYNC)
    assert done.returncode == 0
    assert done.stdout.split() == ["ray_kwargs.ray_init.num_cpus=9", "ray_kwargs.ray_init.num_gpus=2"]
    done = run("hydra", "--n-gpus-per-node", "1", "--", *SEPARATE_ASYNC, "actor_rollout_ref.rollout.nnodes=two")
    assert done.returncode == 2 and "actor_rollout_ref.rollout.nnodes=two" in done.stderr
    # the launchers call it before every run: it loads neither verl nor torch
    probe = "import sys, verl_memagent.cpu.topology; print(sorted({'verl', 'torch', 'ray'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip() == "[]"
