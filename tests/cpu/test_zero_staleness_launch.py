"""Run C of tests/cpu/test_ranks_and_resume_cpu.py, the async trainer at zero staleness, is run A's command
plus `ZERO_STALENESS` and nothing else: composed as the recipe script composes them (dry run), the two
configs differ in the trainer's mode, its warm-up batches and the rollout backend's own settings only, so that
the test comparing the two runs' updates compares the trainers. A misspelt override costs a second here,
where there it costs a vLLM-CPU launch."""

from __future__ import annotations

from pathlib import Path

from gpu_recipes import REPO, SCRIPTS, recipe_args, recipe_env
from omegaconf import OmegaConf
from test_ranks_and_resume_cpu import ZERO_STALENESS, recipe_overrides, scripted_loops

from verl_memagent.algo.trainer import check_rollout_backend
from verl_memagent.recipe_check import check_config, compose, dry_run, flat

VLLM_BACKEND = REPO / "recipes" / "cpu" / "rollout_backend" / "vllm.yaml"


def test_the_async_run_is_the_sync_run_but_for_its_trainer_and_rollout_backend(tmp_path: Path):
    loops = scripted_loops(tmp_path / "agent_loops.yaml")
    env = recipe_env(tmp_path / "model", tmp_path / "data", tmp_path, "http://127.0.0.1:9", loops, ranks=1)
    script, overrides = SCRIPTS["memsearcher"], recipe_overrides("memsearcher")
    sync = compose(dry_run(script, env, recipe_args(tmp_path, *overrides)))
    launch = dry_run(script, env, recipe_args(tmp_path, *overrides, *ZERO_STALENESS))
    colocated = compose(launch)
    # as written: a setting that follows the rollout's name by interpolation (a teacher's engine) is the same
    one, other = flat(sync, resolve=False), flat(colocated, resolve=False)
    differing = {key for key in one.keys() | other.keys() if one.get(key) != other.get(key)}
    backend = set(flat(OmegaConf.load(VLLM_BACKEND)))
    # a backend key, or the section holding it (an empty section is one key here)
    of_backend = {key for key in differing if any(f"{name}.".startswith(f"{key}.") for name in backend)}
    assert differing - of_backend == {"trainer.v1.trainer_mode", "trainer.v1.colocate_async.num_warmup_batches"}
    assert (sync.actor_rollout_ref.rollout.name, colocated.actor_rollout_ref.rollout.name) == ("hf", "vllm")
    check_config(colocated, launch.recipe_yaml)
    check_rollout_backend(colocated, "colocate_async")  # the async trainers refuse the hf backend
    assert colocated.trainer.v1.trainer_mode == "memagent_colocate_async"
    assert colocated.trainer.v1.colocate_async.num_warmup_batches == 0
    # verl then samples the whole batch in one local step (v1/trainer_base.py:130: parameter_sync_step 1)
    assert "parameter_sync_step" not in colocated.trainer.v1.colocate_async
