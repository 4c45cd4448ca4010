"""Registers the multi-context estimators and trainers with verl, when verl itself first imports the
registries they extend, never earlier: importing this module loads nothing but the import hook."""

from __future__ import annotations

import importlib

from verl_memagent.import_hooks import when_imported


def _register_estimators(core_algos) -> None:
    estimators = importlib.import_module("verl_memagent.algo.verl_estimators")
    core_algos.register_adv_est(estimators.GRPO)(estimators.grpo_estimator)
    core_algos.register_adv_est(estimators.GAE)(estimators.gae_estimator)


def _register_trainers(_v1) -> None:
    importlib.import_module("verl_memagent.algo.trainer")  # registers them with verl's `register_trainer`


when_imported("verl.trainer.ppo.core_algos", _register_estimators)
when_imported("verl.trainer.ppo.v1", _register_trainers)
