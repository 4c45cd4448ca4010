"""The Ray resources a CPU run of verl's trainer needs, derived from its topology (ranks per node, nodes).

On the `cpu` platform a data-parallel rank is a trainer worker process holding one of Ray's *logical*
GPUs (`platform.PlatformCPU`); Ray is told how many exist, and how many logical CPUs, when it starts.
Too few logical CPUs and verl's placement groups never become ready: the run waits forever. So the
numbers are computed here from the topology, once, and every launcher asks for them
(`recipes/common/launch.sh` for a local Ray, `recipes/cpu/ray_cluster.sh` for `ray start` on each
node); `patches.require_ray_cpus` checks them in the run itself. Imports nothing heavy: the
launchers call `python -m verl_memagent.cpu.topology` before every run.

`separate_async` (verl's, or ours `memagent_separate_async`) adds rollout replicas of their own, each
rank another logical GPU: the launchers hand the run's hydra overrides after `--`, and the replicas'
ranks are read from them (`standalone_rollout_ranks`).

Usage:
    python -m verl_memagent.cpu.topology hydra --n-gpus-per-node 2 --nnodes 1   # hydra overrides, local Ray
    python -m verl_memagent.cpu.topology hydra --n-gpus-per-node 1 -- OVERRIDES  # the same, replicas counted
    python -m verl_memagent.cpu.topology ray-start --n-gpus-per-node 1           # `ray start` flags, one node
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

#: CPUs in each trainer worker's placement-group bundle: verl's `ResourcePoolManager.max_colocate_count`
#: (single_controller/ray/base.py:146; tests check the two agree). A rollout replica's rank of its own
#: reserves 2 (`RolloutReplica.init_standalone`, workers/rollout/replica.py:205) and is counted at 3 all
#: the same, so that the budget follows from Ray's logical GPUs alone (`patches.require_ray_cpus`)
CPUS_PER_TRAINER_WORKER = 3
#: TransferQueue's storage units as `recipes/cpu/cpu.yaml` sets them (verl's default, 8, costs 8 CPUs)
STORAGE_UNITS = 1


def ray_cpus_needed(gpus: int, storage_units: int = STORAGE_UNITS) -> int:
    """Logical CPUs a run with `gpus` trainer workers holds: the TransferQueue controller, its storage
    units, `CPUS_PER_TRAINER_WORKER` per worker, and one free to place the rollout, agent-loop and
    reward actors."""
    return 1 + storage_units + CPUS_PER_TRAINER_WORKER * gpus + 1


#: `trainer.v1.trainer_mode` values whose rollout replicas run on logical GPUs of their own
SEPARATE_ROLLOUT_MODES = ("separate_async", "memagent_separate_async")


def standalone_rollout_ranks(overrides: list[str], n_gpus_per_node: int) -> int:
    """The ranks of the rollout replicas of their own that a run with these hydra overrides starts:
    `actor_rollout_ref.rollout.nnodes` x `.n_gpus_per_node` (verl's default for the latter: the trainer's
    `n_gpus_per_node`) under a separate-rollout trainer mode, else 0. The last override of a key wins, as
    in hydra; settings made in a YAML file instead are not seen here (give them on the command line)."""
    given = {}
    for override in overrides:
        key, sep, value = override.lstrip("+").partition("=")
        if sep:
            given[key] = value
    if given.get("trainer.v1.trainer_mode") not in SEPARATE_ROLLOUT_MODES:
        return 0
    sizes = {"nnodes": "0", "n_gpus_per_node": str(n_gpus_per_node)}  # verl's rollout.yaml defaults
    ranks = 1
    for name, default in sizes.items():
        key = f"actor_rollout_ref.rollout.{name}"
        value = given.get(key, default)
        if not value.isdigit():
            raise ValueError(f"{key}={value}: the rollout replicas' ranks must be a whole number on the command line")
        ranks *= int(value)
    return ranks


def storage_units_of(transfer_queue_conf) -> int:
    """TransferQueue's storage units in a run's `transfer_queue` config section (none but SimpleStorage's)."""
    backend = transfer_queue_conf.backend
    return backend.SimpleStorage.num_data_storage_units if backend.storage_backend == "SimpleStorage" else 0


def describe_ray_cpus(gpus: int, storage_units: int) -> str:
    """How `ray_cpus_needed` is made up, in words, for error messages."""
    return (
        f"1 TransferQueue controller + {storage_units} storage units (transfer_queue.backend.SimpleStorage."
        f"num_data_storage_units) + {CPUS_PER_TRAINER_WORKER} per trainer worker x {gpus} logical GPUs + 1 to "
        "place the rollout, agent-loop and reward actors"
    )


@dataclass(frozen=True)
class Topology:
    """Data-parallel ranks as verl counts them: `n_gpus_per_node` trainer workers on each of `nnodes` nodes,
    plus `rollout_ranks` of rollout replicas of their own (`separate_async`)."""

    n_gpus_per_node: int
    nnodes: int = 1
    storage_units: int = STORAGE_UNITS
    rollout_ranks: int = 0

    def __post_init__(self) -> None:
        for name in ("n_gpus_per_node", "nnodes", "storage_units"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.rollout_ranks < 0:
            raise ValueError(f"rollout_ranks must be at least 0, got {self.rollout_ranks}")

    @property
    def ranks(self) -> int:
        return self.n_gpus_per_node * self.nnodes

    def local_ray(self) -> dict[str, int]:
        """`ray.init` resources of one local Ray holding every rank (nnodes 1, or nodes simulated in one)."""
        gpus = self.ranks + self.rollout_ranks
        return {"num_cpus": ray_cpus_needed(gpus, self.storage_units), "num_gpus": gpus}

    def node(self) -> dict[str, int]:
        """`ray start` resources of each node of a cluster: its own workers' CPUs, plus room for the
        controller, storage units and the free CPU, since Ray may place them on any node (rollout
        replicas of their own need nodes of their own, started the same way)."""
        return {"num_cpus": ray_cpus_needed(self.n_gpus_per_node, self.storage_units), "num_gpus": self.n_gpus_per_node}


def hydra_overrides(topology: Topology, cluster: bool) -> list[str]:
    """Ray's resources as hydra overrides (`ray_kwargs.ray_init`). Joining a running cluster
    (`cluster`), Ray refuses resource arguments: the nodes declared theirs at `ray start`."""
    resources = {"num_cpus": "null", "num_gpus": "null"} if cluster else topology.local_ray()
    return [f"ray_kwargs.ray_init.{name}={value}" for name, value in resources.items()]


def ray_start_flags(topology: Topology) -> list[str]:
    """`ray start` flags of each node of a cluster."""
    return [f"--{name.replace('_', '-')}={value}" for name, value in topology.node().items()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verl_memagent.cpu.topology", description=__doc__.split("\n")[0])
    parser.add_argument("form", choices=["hydra", "ray-start"], help="hydra overrides, or `ray start` flags of a node")
    parser.add_argument("--n-gpus-per-node", type=int, required=True, help="trainer workers (ranks) per node")
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--storage-units", type=int, default=STORAGE_UNITS, help="TransferQueue storage units")
    parser.add_argument("--cluster", action="store_true", help="hydra: the run joins a running Ray cluster")
    parser.epilog = "After --: the run's hydra overrides, where the rollout replicas' ranks are read."
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    args, overrides = parser.parse_args(argv[:split]), argv[split + 1 :]
    try:
        rollout_ranks = standalone_rollout_ranks(overrides, args.n_gpus_per_node)
        topology = Topology(args.n_gpus_per_node, args.nnodes, args.storage_units, rollout_ranks)
    except ValueError as error:
        parser.error(str(error))
    words = hydra_overrides(topology, args.cluster) if args.form == "hydra" else ray_start_flags(topology)
    print("\n".join(words))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
