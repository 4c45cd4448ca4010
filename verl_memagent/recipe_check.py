"""Compose a recipe's full hydra config exactly as its launch script does, and validate it with verl's checks.

A misspelt or removed config key costs a GPU launch; here it costs a second on CPU. The launch script
itself says what it would run (`MEMAGENT_DRY_RUN=1` prints its `main_ppo` arguments), so the check
composes the very same config path, name and overrides, then applies verl's `validate_config`, its
config dataclasses, and checks that every name the config refers to (estimator, trainer, reward
function, agent loops) resolves.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from verl_memagent.algo.config import MultiContextConfig

MAIN_PPO = "verl.trainer.main_ppo"
#: sections this plugin adds to verl's config (read by our trainers, checked by their own parser)
OUR_KEYS = ("algorithm.multi_context",)


@dataclass(frozen=True)
class RecipeLaunch:
    """What a recipe script would hand to `python -m verl.trainer.main_ppo`."""

    config_dir: Path
    config_name: str
    overrides: list[str]

    @property
    def recipe_yaml(self) -> Path:
        """The recipe's own YAML (the config `main_ppo` composes from)."""
        return self.config_dir / f"{self.config_name}.yaml"


def dry_run(script: str | os.PathLike, env: dict[str, str] | None = None, args: Sequence[str] = ()) -> RecipeLaunch:
    """Run the recipe script (with `args`) with MEMAGENT_DRY_RUN=1 and parse the main_ppo command it prints."""
    environment = {**os.environ, "PYTHON": sys.executable, **(env or {}), "MEMAGENT_DRY_RUN": "1"}
    command = ["bash", str(script), *args]
    done = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"{script} failed in dry-run mode (exit {done.returncode}): {done.stderr.strip()}")
    args = done.stdout.splitlines()
    if MAIN_PPO not in args:
        raise RuntimeError(f"{script} does not launch {MAIN_PPO}; it printed: {args}")
    args = args[args.index(MAIN_PPO) + 1 :]
    options = dict(arg[2:].split("=", 1) for arg in args if arg.startswith("--"))
    return RecipeLaunch(
        config_dir=Path(options["config-path"]),
        config_name=options["config-name"],
        overrides=[arg for arg in args if not arg.startswith("--")],
    )


def compose(launch: RecipeLaunch) -> DictConfig:
    """The config main_ppo would receive: hydra composition of the recipe YAML plus the overrides."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(launch.config_dir.resolve()), version_base=None):
        return hydra_compose(config_name=launch.config_name, overrides=launch.overrides)


def flat(config: DictConfig, resolve: bool = True) -> dict[str, object]:
    """The config's values by dotted key (`a.b.c`), resolved unless told not to (then an interpolation is
    its `${...}` text); an empty section is one key."""

    def walk(tree: dict, prefix: str) -> dict[str, object]:
        found: dict[str, object] = {}
        for key, value in tree.items():
            path = f"{prefix}{key}"
            found.update(walk(value, f"{path}.") if isinstance(value, dict) and value else {path: value})
        return found

    return walk(OmegaConf.to_container(config, resolve=resolve), "")


def verl_base_config() -> DictConfig:
    """verl's own `ppo_trainer` config, the base every recipe inherits."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return hydra_compose(config_name="ppo_trainer")


def unknown_keys(recipe: DictConfig, base: DictConfig, prefix: str = "") -> list[str]:
    """Keys the recipe YAML sets that verl's config does not have (hydra would add them silently).

    A base mapping that is empty is free-form (e.g. `override_config`): anything goes below it.
    """
    found = []
    for key, value in recipe.items_ex(resolve=False):
        if not prefix and key in ("hydra", "defaults"):
            continue
        path = f"{prefix}{key}"
        if key not in base.keys():  # `in base` is False for a mandatory (???) value
            found.append(path)
        elif OmegaConf.is_missing(base, key):
            continue
        elif isinstance(value, DictConfig) and isinstance(base[key], DictConfig) and len(base[key]):
            found += unknown_keys(value, base[key], f"{path}.")
    return found


def check_config(config: DictConfig, recipe_yaml: Path) -> None:
    """Raise with a clear message on the first problem verl would hit at launch (or hide until then)."""
    import verl  # noqa: F401  (loads the plugin: our estimators, trainers and agent loops register)
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    extra = [key for key in unknown_keys(OmegaConf.load(recipe_yaml), verl_base_config()) if key not in OUR_KEYS]
    if extra:
        raise ValueError(f"{recipe_yaml}: keys unknown to verl 0.9.1's ppo_trainer config: {extra}")
    config = config.copy()
    OmegaConf.resolve(config)
    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    MultiContextConfig.from_algorithm(config.algorithm)
    omega_conf_to_dataclass(
        OmegaConf.masked_copy(config.algorithm, [k for k in config.algorithm if k != "multi_context"])
    )
    omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
    if need_critic(config):
        omega_conf_to_dataclass(config.critic)
    get_adv_estimator_fn(config.algorithm.adv_estimator)
    get_trainer_cls(config.trainer.v1.trainer_mode)
    if get_custom_reward_fn(config) is None:
        raise ValueError("reward.custom_reward_function.path is not set: the recipe would train on no reward")
    agent = config.actor_rollout_ref.rollout.agent
    names = [entry.name for entry in OmegaConf.load(agent.agent_loop_config_path)]
    if agent.default_agent_loop not in names:
        raise ValueError(
            f"actor_rollout_ref.rollout.agent.default_agent_loop={agent.default_agent_loop!r} is not in "
            f"{agent.agent_loop_config_path} (it has {names})"
        )
