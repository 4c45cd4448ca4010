"""The papers' released training values our recipes and agent defaults must hold: the one copy of them.

`tests/recipes/test_recipe_configs.py` checks that every recipe composes, as its script does, to
`RELEASED` and that each agent's defaults are `RELEASED_AGENT`; `tests/test_docs_match_sources.py`
checks that docs/fidelity.md states each value in the row named here. Each value is grouped under
that row's first cell, with the released file and line beside it; docs/fidelity.md gives the reasons
where ours differ.
"""

from __future__ import annotations

#: agent -> fidelity row -> config key -> value
RELEASED_BY_ROW = {
    "memsearcher": {  # icip-cas/MemSearcher@83a3bea train.sh and verl/trainer/config/ppo_trainer.yaml
        "batch / mini-batch": {
            "data.train_batch_size": 256,  # train.sh:9
            "actor_rollout_ref.actor.ppo_mini_batch_size": 128,  # train.sh:10
            # mini-batches of 128 x n turn rows, the released count (fsdp_workers.py:117-118, dp_actor.py:256)
            "algorithm.multi_context.fixed_optimizer_steps": False,
        },
        "per-context response cap": {"data.max_response_length": 6024},  # train.sh:13
        "lr, warm-up": {
            "actor_rollout_ref.actor.optim.lr": 1e-6,  # train.sh:11
            "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": 0.0,  # ppo_trainer.yaml:63
        },
        "KL": {
            "actor_rollout_ref.actor.use_kl_loss": True,  # train.sh:64
            "actor_rollout_ref.actor.kl_loss_coef": 0.001,  # train.sh:65
            "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",  # train.sh:66
            "algorithm.use_kl_in_reward": False,  # ppo_trainer.yaml:196
        },
        "entropy": {"actor_rollout_ref.actor.entropy_coeff": 0.001},  # ppo_trainer.yaml:50
        "clip": {
            "actor_rollout_ref.actor.clip_ratio": 0.2,  # ppo_trainer.yaml:45
            "actor_rollout_ref.actor.clip_ratio_c": 3.0,  # ppo_trainer.yaml:48
            "actor_rollout_ref.actor.grad_clip": 1.0,  # ppo_trainer.yaml:43
        },
        "loss aggregation": {"actor_rollout_ref.actor.loss_agg_mode": "token-mean"},  # ppo_trainer.yaml:49
        "epochs, steps": {
            "actor_rollout_ref.actor.ppo_epochs": 1,  # ppo_trainer.yaml:55
            "trainer.total_epochs": 1,  # train.sh:31
        },
        "n": {"actor_rollout_ref.rollout.n": 5},  # train.sh:18
        "sampling (training)": {
            "actor_rollout_ref.rollout.temperature": 1.0,  # ppo_trainer.yaml:89
            "actor_rollout_ref.rollout.top_p": 0.99,  # vllm_rollout_spmd.py:593
            "actor_rollout_ref.rollout.top_k": 10000,  # vllm_rollout_spmd.py:594
        },
        "reward": {"reward.custom_reward_function.name": "f1_with_format"},  # re_call.py:165-184
    },
    "mem1": {  # MIT-MI/MEM1@6f22061 Mem1/train/train_ppo.sh and verl/trainer/config/ppo_trainer.yaml
        "batch / mini-batch": {
            "data.train_batch_size": 128,  # train_ppo.sh:33
            "actor_rollout_ref.actor.ppo_mini_batch_size": 64,  # train_ppo.sh:46
            "critic.ppo_mini_batch_size": 64,  # ppo_trainer.yaml:116
            # 2 optimizer steps per step: the released mini-batch holds 64 trajectories, one packed row each
            "algorithm.multi_context.fixed_optimizer_steps": True,
        },
        "prompt cap": {"data.max_prompt_length": 4096},  # train_ppo.sh:35
        "tokens per turn": {"data.max_response_length": 1000},  # train_ppo.sh:36
        "gamma, lambda": {
            "algorithm.gamma": 1.0,  # ppo_trainer.yaml:150
            "algorithm.lam": 1.0,  # ppo_trainer.yaml:151
        },
        "KL": {
            "algorithm.kl_penalty": "kl",  # ppo_trainer.yaml:154
            "algorithm.use_kl_in_reward": True,  # ppo_trainer.yaml:155-157 (KL in the reward, gae)
            "algorithm.kl_ctrl.kl_coef": 0.001,  # train_ppo.sh:69
            "actor_rollout_ref.actor.use_kl_loss": False,  # ppo_trainer.yaml:36
        },
        "actor lr, warm-up": {
            "actor_rollout_ref.actor.optim.lr": 1e-6,  # train_ppo.sh:42
            "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": 0.05,  # train_ppo.sh:45
        },
        "clip": {
            "actor_rollout_ref.actor.clip_ratio_c": float("inf"),  # no dual clip (core_algos.py:165-197)
            "actor_rollout_ref.actor.clip_ratio": 0.2,  # ppo_trainer.yaml:34
            "actor_rollout_ref.actor.grad_clip": 1.0,  # ppo_trainer.yaml:32
            "critic.cliprange_value": 0.5,  # ppo_trainer.yaml:126
        },
        "entropy": {"actor_rollout_ref.actor.entropy_coeff": 0.001},  # ppo_trainer.yaml:35
        "epochs, steps": {
            "actor_rollout_ref.actor.ppo_epochs": 1,  # ppo_trainer.yaml:39
            "trainer.total_epochs": 3,  # train_ppo.sh:82
            "trainer.total_training_steps": 500,  # train_ppo.sh:83
        },
        "sampling (training)": {
            "actor_rollout_ref.rollout.n": 1,  # train_ppo.sh:57
            "actor_rollout_ref.rollout.temperature": 1.0,  # train_ppo.sh:58
            "actor_rollout_ref.rollout.top_p": 0.95,  # ppo_trainer.yaml:71
        },
        "critic lr, warm-up": {
            "critic.optim.lr": 1e-5,  # train_ppo.sh:60
            "critic.optim.lr_warmup_steps_ratio": 0.015,  # train_ppo.sh:62
        },
        "reward": {"reward.custom_reward_function.name": "multi_objective_em"},  # qa_multiple.py:132-160
    },
}

#: agent -> fidelity row -> agent setting -> value each paper agent's defaults (agent_loops.yaml) hold;
#: react holds memsearcher's (test_react_differs_from_memsearcher_only_in_context_management)
RELEASED_AGENT_BY_ROW = {
    "memsearcher": {
        "turns": {"max_turns": 5},  # train.sh:22
        "tokens per call": {"max_new_tokens": 512},  # vllm_rollout_spmd.py:591, 696
        "documents per search": {"topk": 10},  # scripts/serving/retriever_serving.py:42-45
        "memory overflow": {"memory_overflow": "end"},  # vllm_rollout_spmd.py:716-756
        "tool result cap": {"observation_max_tokens": None},  # vllm_rollout_spmd.py:452-455, 667-679
        "which turns go on": {"action_rules": "released"},  # vllm_rollout_spmd.py:612-679, re_call.py:97-184
    },
    "mem1": {
        "turns": {"max_turns": 6},  # train_ppo.sh:10
        "tokens per turn": {"max_new_tokens": 1000},  # train_ppo.sh:36
        "documents per search": {"topk": 3},  # train_ppo.sh:88
        "format rule": {"require_state": False},  # generation_think.py:502-512
        "observation cap": {"observation_max_tokens": 1000},  # train_ppo.sh:38
        "long histories": {"released_history_cut": False},  # ours: the released cut loses the question
    },
}


def flat(by_row: dict[str, dict[str, dict]]) -> dict[str, dict]:
    """agent -> key -> value, the rows merged."""
    return {agent: {k: v for values in rows.values() for k, v in values.items()} for agent, rows in by_row.items()}


#: agent -> config key -> value
RELEASED = flat(RELEASED_BY_ROW)
#: agent -> agent setting -> value
RELEASED_AGENT = flat(RELEASED_AGENT_BY_ROW)
