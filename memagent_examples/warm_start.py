"""Supervised warm start from scripted trajectories played through the real agent loop.

A random tiny model never writes a valid action, so reinforcement learning gets no reward to follow.
A task's demonstrations (scripted texts) are played through the project's own agent loop
(`ScriptedPolicy` behind verl's `generate`), against the real retriever, and the model is trained on
exactly the samples the loop emits: each context's prompt ids, then its response ids with the loss on
generated tokens only (response_mask). The model thus learns the agent's real contexts, not a
re-rendering of them. `warm_start` is the one recipe both example tasks build their starts with: each
task says what it demonstrates (`Demonstrations`), the options (`WarmStartOptions`) how long and how
the model trains.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from memagent_examples.build_records import BuildSaver, build_record
from memagent_examples.scripted import ScriptedPolicy
from memagent_examples.training import IGNORE, ResumePoint, supervised_steps
from verl_memagent.agent import instantiate_agent_loop, verl_trainer_config, verl_worker_row
from verl_memagent.output_fields import FinishReason, OutputField
from verl_memagent.progress import progress

Sample = tuple[list[int], list[int]]


async def scripted_samples(
    agent: str,
    scripts: Sequence[tuple[str, list[str]]],
    tokenizer,
    agent_loops_yaml: str,
    prompt_length: int,
    response_length: int,
    hf_model_type: str | None,
    **settings,
) -> list[Sample]:
    """(input ids, labels) of every context the agent loop builds while replaying each (question, texts).

    `hf_model_type` (the model's `config.model_type`) picks verl's token builder, as in training:
    Qwen's restores the newline after `<|im_end|>` at turn boundaries, the generic one does not, and
    a warm start on contexts that differ from the live ones teaches the wrong thing.
    """
    config = verl_trainer_config(prompt_length=prompt_length, response_length=response_length)
    samples = []
    played = progress(len(scripts), "demonstrations played", unit="trajectories")
    for index, (question, texts) in enumerate(scripts):
        policy = ScriptedPolicy(tokenizer, texts)
        loop = instantiate_agent_loop(
            agent, config, policy, tokenizer, hf_model_type, path=agent_loops_yaml, **settings
        )
        row = verl_worker_row(question, data_source="scripted", uid=f"scripted-{index}", session_id=0, global_steps=0)
        outputs = await loop.run({"temperature": 1.0, "logprobs": False}, **row)
        outputs = outputs if isinstance(outputs, list) else [outputs]
        reason = outputs[-1].extra_fields.get(OutputField.FINISH_REASON)
        if reason != FinishReason.ANSWER or len(policy.calls) != len(texts):
            raise ValueError(f"the script for {question!r} did not play out as an answer: {reason}")
        for out in outputs:
            labels = [tok if keep else IGNORE for tok, keep in zip(out.response_ids, out.response_mask, strict=True)]
            samples.append((out.prompt_ids + out.response_ids, [IGNORE] * len(out.prompt_ids) + labels))
        played.update()
    played.close()
    return samples


@dataclass(frozen=True)
class WarmStartOptions:
    """How a warm start trains, whatever the task. The build record names the numbers (`recorded`).

    `copy_steps`: copy pretraining (`copy_rows.copy_pretraining`) before the demonstrations, 0 where the
    model given is copy-pretrained already; `decay_steps`, `unpadded`: as `supervised_steps`';
    `checkpoint_every` > 0 also saves the model every that many steps to `out/step_N`, the same models
    as runs of N steps; `resume_every` > 0 keeps the run's whole state in `out/resume.pt` every that
    many steps, and a run started again with the same inputs resumes from it (`ResumePoint`)."""

    steps: int
    lr: float = 1e-3
    batch_size: int = 8
    seed: int = 0
    copy_steps: int = 0
    decay_steps: int = 0
    unpadded: bool = False
    checkpoint_every: int = 0
    resume_every: int = 0

    def recorded(self) -> dict:
        """The inputs of the build record: what the model's weights depend on."""
        return {key: value for key, value in asdict(self).items() if key in RECORDED}


#: the options a build record names (saving and resuming leave the weights as they are)
RECORDED = ("seed", "copy_steps", "steps", "lr", "decay_steps", "batch_size")


@dataclass(frozen=True)
class Demonstrations:
    """What a task shows its warm start: the `samples` its demonstrations' contexts make, which of them
    the build record digests (`contexts`: their count, as `{"doors": 16}` or `{"samples": 64}`, and
    `sha256`), the synthetic rows added to every step's loss (`extra_rows`, each with a
    `loss(model, generator)`) and the task's own inputs to record (the agent, how many questions)."""

    samples: list[Sample]
    contexts: dict
    extra_rows: tuple = ()
    inputs: dict = field(default_factory=dict)


def warm_start(
    model_dir: Path, out: Path, demonstrate: Callable[[object, str], Demonstrations], options: WarmStartOptions
) -> list[float]:
    """The model of `model_dir` trained on the demonstrations `demonstrate(tokenizer, model_type)` gives,
    as `options` say; saved to `out` with its build record. Returns the loss of each supervised step."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memagent_examples.copy_rows import copy_pretraining

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    torch.manual_seed(options.seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    shown = demonstrate(tokenizer, model.config.model_type)
    record = build_record({**shown.inputs, **options.recorded()}, shown.contexts, len(shown.samples))
    saver = BuildSaver(model, tokenizer, record, out, options.checkpoint_every)
    if options.copy_steps:
        copy_losses = copy_pretraining(model, options.copy_steps, seed=options.seed)
        print(f"copy pretraining: {options.copy_steps} steps, loss {copy_losses[0]:.3f} -> {copy_losses[-1]:.3f}")
    out.mkdir(parents=True, exist_ok=True)
    identity = {"inputs": record["inputs"], "contexts": record["contexts"]}
    resume = ResumePoint(out / "resume.pt", options.resume_every, identity) if options.resume_every else None
    losses = supervised_steps(
        model,
        shown.samples,
        options.steps,
        options.lr,
        options.batch_size,
        tokenizer.pad_token_id,
        options.seed,
        extra_rows=shown.extra_rows,
        after_step=saver.after_step,
        unpadded=options.unpadded,
        decay_steps=options.decay_steps,
        resume=resume,
    )
    saver.save(out, options.steps)
    if resume:
        resume.path.unlink(missing_ok=True)
    return losses
