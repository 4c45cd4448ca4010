"""Every recipe's full config, composed exactly as its launch script composes it, passes verl's checks.

The scripts run for real in dry-run mode (MEMAGENT_DRY_RUN=1 prints the main_ppo arguments), with
the data prepared from the bundled samples by `verl-memagent prepare` and the tiny local model as
MODEL_PATH (verl's model config loads it; hub names cannot be reached here).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hydra.errors import ConfigCompositionException
from released_values import RELEASED, RELEASED_AGENT

from verl_memagent.cli import main as cli
from verl_memagent.recipe_check import check_config, compose, dry_run, flat

REPO = Path(__file__).resolve().parents[2]
RECIPE_SCRIPTS = sorted(p for p in (REPO / "recipes").glob("*/run_*.sh"))
AGENT_OF = {"memsearcher": "memsearcher", "mem1": "mem1", "react": "react"}


def _agent(script: Path) -> str:
    return AGENT_OF[script.parent.name]


@pytest.fixture(scope="session")
def prepared(tmp_path_factory, data_dir) -> dict[str, Path]:
    """One DATA_DIR per agent, with train/test parquet made from the bundled QA files."""
    dirs = {}
    for agent in AGENT_OF.values():
        out = tmp_path_factory.mktemp(f"data_{agent}")
        objectives = ["--objectives", "2"] if agent == "mem1" else []
        train = ["--input", f"hotpotqa={data_dir / 'qa_multihop.jsonl'}", "--limit", "64", *objectives]
        assert cli(["prepare", *train, "--agent", agent, "--out", str(out / "train.parquet"), "--split", "train"]) == 0
        test = ["--input", f"bamboogle={data_dir / 'qa_bamboogle.jsonl'}", "--limit", "16"]
        assert cli(["prepare", *test, "--agent", agent, "--out", str(out / "test.parquet"), "--split", "test"]) == 0
        dirs[agent] = out
    return dirs


def _env(prepared, script: Path, tiny_model_dir: Path) -> dict[str, str]:
    return {"MODEL_PATH": str(tiny_model_dir), "DATA_DIR": str(prepared[_agent(script)])}


def test_every_recipe_family_has_a_script():
    assert {p.parent.name for p in RECIPE_SCRIPTS} >= {"memsearcher", "mem1", "react"}


@pytest.mark.parametrize("script", RECIPE_SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_recipe_config_composes_and_validates(script, prepared, tiny_model_dir, tokenizer):
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from verl_memagent.agent import instantiate_agent_loop

    launch = dry_run(script, _env(prepared, script, tiny_model_dir))
    config = compose(launch)
    check_config(config, launch.recipe_yaml)

    agent = config.actor_rollout_ref.rollout.agent
    assert agent.default_agent_loop == _agent(script)
    assert config.actor_rollout_ref.model.path == str(tiny_model_dir)
    # the agent loop the recipe trains is constructible with the recipe's config (settings, templates)
    loop = instantiate_agent_loop(agent.default_agent_loop, config, None, tokenizer, path=agent.agent_loop_config_path)
    assert loop.settings.max_turns >= 1
    # the prepared data loads with verl's dataset under the recipe's data config
    dataset = RLHFDataset(data_files=config.data.train_files, tokenizer=tokenizer, config=config.data)
    assert len(dataset) > 0
    rows = pd.read_parquet(config.data.train_files)
    assert set(rows["agent_name"]) == {_agent(script)}


def test_misspelt_override_fails_composition(prepared, tiny_model_dir):
    script = REPO / "recipes/memsearcher/run_qwen2.5_3b.sh"
    launch = dry_run(script, _env(prepared, script, tiny_model_dir))
    launch.overrides.append("actor_rollout_ref.rollout.temprature=0.7")
    with pytest.raises(ConfigCompositionException, match="temprature"):
        compose(launch)


def test_misspelt_yaml_key_is_named(tmp_path, prepared, tiny_model_dir):
    config_dir = tmp_path / "config"
    shutil.copytree(REPO / "recipes/memsearcher/config", config_dir)
    recipe = config_dir / "memsearcher.yaml"
    recipe.write_text(recipe.read_text().replace("    entropy_coeff: 0.001", "    entropy_coef: 0.001"))
    script = REPO / "recipes/memsearcher/run_qwen2.5_3b.sh"
    launch = dry_run(script, _env(prepared, script, tiny_model_dir))
    launch = type(launch)(config_dir, launch.config_name, launch.overrides)
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.actor\.entropy_coef"):
        check_config(compose(launch), launch.recipe_yaml)


LAUNCHER = REPO / "recipes/common/launch.sh"
#: the recipe scripts that train: the GPU recipes and the CPU ones (recipes/cpu/preamble.sh's train_on_cpu)
TRAINING_SCRIPTS = [
    *RECIPE_SCRIPTS,
    *(REPO / "recipes/cpu" / name for name in ("run.sh", "learn_codes.sh", "composed_doors.sh")),
]


def _commands(script: Path) -> str:
    """The script's text without its comments."""
    return "\n".join(line.split("#", 1)[0] for line in script.read_text().splitlines())


def test_every_recipe_starts_verls_trainer_through_the_launcher():
    """recipes/common/launch.sh is the one place a recipe script starts main_ppo (its environment
    defaults, fail-fast checks, CPU resources and `ray job submit` then hold for every recipe)."""
    own_launch = [
        p.name for p in REPO.glob("recipes/**/*.sh") if p != LAUNCHER and "verl.trainer.main_ppo" in _commands(p)
    ]
    assert own_launch == []
    # each calls the launcher, or train_on_cpu (which calls it), or execs a recipe script that does (react)
    launches = re.compile(r"\blaunch_main_ppo\b|\btrain_on_cpu\b|exec .*/run_[\w.]+\.sh")
    assert [p.name for p in TRAINING_SCRIPTS if not launches.search(_commands(p))] == []


def test_the_learning_demos_trainer_launch_composes(tmp_path, prepared):
    """What recipes/cpu/learn_codes.sh hands the launcher (train_on_cpu learn_codes, the shipped warm start,
    its agent loops), printed in dry-run mode, composes to the run on CPU at one rank. (check_config is
    not applied: learn_codes.yaml leaves default_agent_loop to verl's, the parquet's agent_name column
    picks memsearcher.)"""
    from verl_memagent.cpu.topology import Topology

    harness = tmp_path / "train.sh"
    harness.write_text(
        "set -euo pipefail\n"
        f'source "{REPO}/recipes/cpu/preamble.sh" learn_codes\n'
        f'cp "{prepared["memsearcher"]}/train.parquet" "$WORK/train.parquet"\n'
        'AGENT_LOOPS_YAML=$HERE/learn_codes_agent_loops.yaml train_on_cpu learn_codes "$START" data.seed=3\n'
    )
    work, start = tmp_path / "work", REPO / "memagent_examples/learn_codes/start"
    launch = dry_run(harness, {"WORK": str(work), "MEMAGENT_CPU_CACHE": str(tmp_path / "cache"), "START": str(start)})
    assert launch.recipe_yaml == REPO / "recipes/cpu/learn_codes.yaml"
    config = compose(launch)
    assert config.actor_rollout_ref.model.path == str(start)
    assert config.actor_rollout_ref.rollout.agent.agent_loop_config_path == str(
        REPO / "recipes/cpu/learn_codes_agent_loops.yaml"
    )
    assert (config.data.train_files, config.data.val_files) == (str(work / "train.parquet"), str(work / "test.parquet"))
    assert (work / "test.parquet").read_bytes() == (work / "train.parquet").read_bytes()
    assert config.trainer.default_local_dir == str(work / "checkpoints") and config.data.seed == 3
    assert (config.trainer.device, config.trainer.n_gpus_per_node, config.trainer.nnodes) == ("cpu", 1, 1)
    assert dict(config.ray_kwargs.ray_init) == {**config.ray_kwargs.ray_init, **Topology(1).local_ray()}


def _run_for_real(script: Path, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHON": sys.executable, **env}
    environment.pop("MEMAGENT_DRY_RUN", None)
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, env=environment, timeout=120)


def test_missing_data_fails_fast(tmp_path, tiny_model_dir):
    script = REPO / "recipes/react/run_qwen2.5_3b.sh"
    done = _run_for_real(script, DATA_DIR=str(tmp_path), MODEL_PATH=str(tiny_model_dir))
    assert done.returncode == 1
    assert f"data file {tmp_path}/train.parquet is missing" in done.stderr


def test_unhealthy_retriever_fails_fast(prepared, tiny_model_dir):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        done = _run_for_real(
            REPO / "recipes/react/run_qwen2.5_3b.sh",
            DATA_DIR=str(prepared["react"]),
            MODEL_PATH=str(tiny_model_dir),
            MEMAGENT_RETRIEVER_URL=url,
        )
    assert done.returncode == 1
    assert f"{url}/health does not answer" in done.stderr and "a retriever does not answer" in done.stderr


#: the keys in which react's composed config may differ from memsearcher's: the agent, the run's name
#: and the response length its growing context needs, plus the keys verl derives from them
CONTEXT_KEYS = {
    "actor_rollout_ref.rollout.agent.default_agent_loop",
    "trainer.experiment_name",
    "data.max_response_length",
    "actor_rollout_ref.rollout.response_length",
    "actor_rollout_ref.rollout.trace.experiment_name",
    "trainer.default_local_dir",
    "distillation.teacher_models.teacher_model.inference.response_length",
}
#: the agent settings in which react may differ from memsearcher: what manages the context
CONTEXT_SETTINGS = {"memory_max_tokens", "memory_overflow", "prompts", "tags"}


def _composed(script: Path, env: dict[str, str]) -> dict:
    return flat(compose(dry_run(script, env)))


@pytest.mark.parametrize("agent", sorted(RELEASED))
def test_recipe_composes_to_the_released_settings(agent, prepared, tiny_model_dir, tokenizer, trainer_config):
    from verl_memagent.agent import instantiate_agent_loop

    for script in REPO.glob(f"recipes/{agent}/run_*.sh"):
        config = _composed(script, _env(prepared, script, tiny_model_dir))
        assert {key: config[key] for key in RELEASED[agent]} == RELEASED[agent], script
    loop = instantiate_agent_loop(agent, trainer_config, None, tokenizer)
    assert {key: getattr(loop.settings, key) for key in RELEASED_AGENT[agent]} == RELEASED_AGENT[agent]
    assert loop.settings.prompt_style == "released_train"


@pytest.mark.parametrize("size", ["3b", "7b"])
def test_react_differs_from_memsearcher_only_in_context_management(
    size, prepared, tiny_model_dir, tokenizer, trainer_config
):
    """The baseline comparison measures memory alone: same reward, optimisation, sampling, tool and limits.

    MEM1 is another paper's setting (PPO with a critic, multi-objective EM, its own format), compared
    with its own released values above rather than with these two (docs/fidelity.md).
    """
    from verl_memagent.agent import instantiate_agent_loop

    env = {"MODEL_PATH": str(tiny_model_dir), "DATA_DIR": str(prepared["memsearcher"])}
    memsearcher = _composed(REPO / f"recipes/memsearcher/run_qwen2.5_{size}.sh", env)
    react = _composed(REPO / f"recipes/react/run_qwen2.5_{size}.sh", env)
    assert memsearcher.keys() == react.keys()
    differing = {key for key in memsearcher if memsearcher[key] != react[key]}
    assert differing == CONTEXT_KEYS, differing ^ CONTEXT_KEYS

    settings = {
        name: vars(instantiate_agent_loop(name, trainer_config, None, tokenizer).settings)
        for name in ("memsearcher", "react")
    }
    differing = {key for key in settings["react"] if settings["react"][key] != settings["memsearcher"][key]}
    assert differing <= CONTEXT_SETTINGS, differing - CONTEXT_SETTINGS
    # the tags both parse (reasoning, tool call) are the same; the others name memory or `ours` roles
    assert {role: settings["react"]["tags"][role] for role in ("think", "tool_call")} == {
        role: settings["memsearcher"]["tags"][role] for role in ("think", "tool_call")
    }
