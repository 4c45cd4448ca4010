"""Build an agent loop outside a verl worker exactly as verl's AgentLoopWorker does (eval, tests, benchmarks).

verl instantiates a loop per sample with `hydra.utils.instantiate(entry, trainer_config=..., ...)`,
where `entry` is the agent's registry entry (from `agent.register` or the agent-loop YAML). This does the
same with the same arguments, so what runs here is what runs in training.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import Any

import hydra
import verl
from omegaconf import DictConfig, OmegaConf
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
from verl.utils.dataset.rl_dataset import get_dataset_class

from verl_memagent.agent import AGENT_LOOPS_YAML

_VERL_PPO_CONFIG = Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"


def verl_trainer_config(**rollout_overrides: Any) -> DictConfig:
    """verl's own full PPO trainer config (its generated defaults), with rollout fields overridden."""
    config = OmegaConf.load(_VERL_PPO_CONFIG)
    for key, value in rollout_overrides.items():
        OmegaConf.update(config, f"actor_rollout_ref.rollout.{key}", value, merge=False)
    return config


def verl_sampling_params(
    temperature: float = 1.0, top_p: float = 1.0, top_k: int = -1, logprobs: bool = True
) -> dict[str, Any]:
    """The sampling params verl's AgentLoopWorker hands every loop's `run()` (agent_loop.py,
    `generate_sequences`): the rollout's temperature, top_p and top_k, no repetition penalty, and
    whether the server returns log-probs. The defaults: plain sampling with log-probs, as in training."""
    return {
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "repetition_penalty": 1.0,
        "logprobs": logprobs,
    }


def verl_worker_row(question: str, extra_info: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    """The row verl's AgentLoopWorker hands a loop's `run()` for a question asked in one user message: the
    message as `raw_prompt` (the dataset's `prompt`), the question in `extra_info` (with `extra_info`'s
    other keys), and `fields` (`uid`, `session_id`, `reward_model`, ...) beside them."""
    messages = [{"role": "user", "content": question}]
    return {"raw_prompt": messages, "extra_info": {"question": question, **(extra_info or {})}, **fields}


@cache
def _dataset_class(custom_path: str | None, custom_name: str | None) -> type:
    """verl's dataset class for `data.custom_cls`, resolved once (eval builds one loop per question)."""
    return get_dataset_class(OmegaConf.create({"custom_cls": {"path": custom_path, "name": custom_name}}))


def agent_loop_entry(name: str, path: str | os.PathLike = AGENT_LOOPS_YAML) -> DictConfig:
    """The entry `name` of an agent-loop YAML, as verl's worker reads it (the file is read once, as there)."""
    entries = _agent_loop_entries(str(path), os.stat(path).st_mtime_ns)
    if name not in entries:
        raise KeyError(f"agent loop {name!r} is not in {path}")
    return entries[name]


@cache
def _agent_loop_entries(path: str, mtime_ns: int) -> dict[str, DictConfig]:
    """The entries of an agent-loop YAML by name; read again only when the file changes."""
    return {entry.name: entry for entry in OmegaConf.load(path)}


def instantiate_agent_loop(
    name: str,
    trainer_config: DictConfig,
    server_manager,
    tokenizer,
    hf_model_type: str | None = None,
    path: str | os.PathLike = AGENT_LOOPS_YAML,
    tools: list | None = None,
    **settings: Any,
):
    """The agent loop `name` from `path`, with `settings` overriding the entry's, built like verl builds it.

    `tools` are verl tools built once per process, as the worker hands them to every loop.
    """
    custom = trainer_config.data.get("custom_cls") or {}
    return hydra.utils.instantiate(
        config=agent_loop_entry(name, path),
        trainer_config=DictConfigWrap(config=trainer_config),
        server_manager=server_manager,
        tokenizer=tokenizer,
        processor=None,
        hf_model_type=hf_model_type,
        dataset_cls=_dataset_class(custom.get("path"), custom.get("name")),
        data_config=DictConfigWrap(trainer_config.data),
        tools=ToolListWrap(tools or []),
        **settings,
    )
