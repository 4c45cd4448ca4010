"""Each agent's warm start on the composed task: demonstrations in its own format, copy and answer rows.

The three agents start from one copy-pretrained tiny model (`copy_pretrain`) and are warm-started the
same way (`warm_start_agent`: the same steps, lr and batch): scripted demonstrations of questions of 1 to
8 demonstration doors (`demonstration_scripts`), written in the agent's own format (`ModelFormat`) and
played through its real loop against the real retriever, with copy rows and answer rows (`AnswerRows`)
in every step. The three warm starts at the defaults are shipped in `starts/` (`SHIPPED_STARTS`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from memagent_examples.build_records import contexts_digest
from memagent_examples.composed_doors.task import PROMPT_LENGTH, RESPONSE_LENGTH, read_door_sets, records
from memagent_examples.copy_rows import CopyRows, copy_pretraining
from memagent_examples.doors import Door
from memagent_examples.model_format import ModelFormat
from memagent_examples.training import IGNORE, labelled_loss
from memagent_examples.warm_start import Demonstrations, WarmStartOptions, scripted_samples, warm_start
from verl_memagent.data.compose import compose_multi_objective

#: objectives per demonstrated question: every k the sweep evaluates, 1 to 8; demonstrations of 1-3 alone
#: taught no policy to compose more doors (docs/papers_claim.md)
DEMO_OBJECTIVES = tuple(range(1, 9))
#: demonstrated questions per k, and the warm start's supervised steps: the tiny model learns to choose
#: the next door and keep several statements over thousands of steps, and its answers swing at a
#: constant lr, so the last third of the steps decays it to 0 (`composed_options`)
TASKS_PER_OBJECTIVE = 64
WARM_STEPS = 3000
SEARCH_THOUGHT = "I must search for the next password."
#: copy rows of every copy-pretraining and warm-start step: the agents' contexts put the question some
#: 400 tokens in, where 128-token copy rows teach no copying (`copy_rows.distant_copy_batch`)
COPY_ROWS = CopyRows(adjacent=8, distant=4)
#: answer rows of every warm-start step (`AnswerRows`)
ANSWER_ROWS = 32
#: the first demonstration contexts a build record digests
DIGESTED_SAMPLES = 64
#: the warm starts the sweep's committed records grew from, one folder per agent (model, tokenizer and the
#: `build.json` of `warm_start_agent` at the defaults, seed 0): a warm start built on another CPU is another
#: model (`build_records`), and these took ~7 core-hours, so RL starts from them unless told to build
SHIPPED_STARTS = Path(__file__).resolve().parent / "starts"


def composed_texts(model: ModelFormat, doors: Sequence[Door]) -> list[str]:
    """What an agent that knows the task writes for a question on `doors`, in `model`'s format: one
    search per door in the question's order, each noting the statement it read (MemSearcher's memory
    after the search, MEM1's internal state before the next action), then every password, `;`-separated.
    The statements are restated word for word, so keeping one is copying it (see `learn_codes.task`)."""
    statements = [door.statement for door in doors]
    texts = []
    for i, door in enumerate(doors):
        notes = " ".join(statements[: i + 1] if "memory" in model.tags else statements[:i])
        texts += model.search(SEARCH_THOUGHT, f"password of {door.name}", notes)
    answer = " " + "; ".join(door.password for door in doors)
    return [*texts, model.answer(" ".join(statements), answer, " ".join(statements))]


def demonstration_scripts(
    model: ModelFormat,
    doors: Sequence[Door],
    tasks_per_objective: int,
    seed: int = 0,
    objectives: Sequence[int] = DEMO_OBJECTIVES,
) -> list[tuple[str, list[str]]]:
    """(question, texts) of `tasks_per_objective` composed questions for each k in `objectives`."""
    by_id = {record.id: door for record, door in zip(records(doors, "demos"), doors, strict=True)}
    pool = list(records(doors, "demos"))
    scripts = []
    for k in objectives:
        for row in compose_multi_objective(pool, k, seed=seed + k, num_tasks=tasks_per_objective):
            task_doors = [by_id[i] for i in row["extra_info"]["id"].split("+")]
            scripts.append((row["extra_info"]["question"], composed_texts(model, task_doors)))
    return scripts


@dataclass(frozen=True)
class AnswerRows:
    """Synthetic rows for an answer's last copy, in one agent's answer format: random tokens holding 1 to
    `statements` statements that end " is V." (as many as a demonstrated question asks), then the
    agent's answer opener (MemSearcher's `</think> \\boxed{`, MEM1's `</IS><answer>`) and the values in
    their order, `;`-separated, then its closer; labels on the answer only. Why: in a demonstration the
    password after the opener is one labelled token in hundreds, and a tiny model never finds that
    lookup from so rare a signal (teacher-forced, at chance after 600 warm-start steps, and after 400
    more on answer turns alone); rows that each end in one teach it (docs/papers_claim.md). Rows of at
    most 3 statements taught answers of at most 3: an answer of 8 passwords repeated one after the
    fourth until the call's tokens ran out."""

    statement_end: tuple[int, int]  # " is" and "."
    opener: tuple[int, ...]
    separator: tuple[int, ...]
    closer: tuple[int, ...]
    rows: int = ANSWER_ROWS
    statements: int = max(DEMO_OBJECTIVES)
    length: int = 96

    @classmethod
    def of(cls, model: ModelFormat, tokenizer, rows: int = ANSWER_ROWS) -> AnswerRows:
        text = model.answer("\x00", " \x01", "\x00")  # the format around a thought and an answer
        opener, closer = text[text.rindex("\x00") + 1 :].split(" \x01")
        ids = lambda part: tuple(tokenizer(part, add_special_tokens=False).input_ids)  # noqa: E731
        (is_id,), (stop,) = ids(" is"), ids(".")
        return cls((is_id, stop), ids(opener), ids(";"), ids(closer), rows)

    def batch(self, generator, vocab_size: int):
        """`rows` rows of `length` tokens and their labels (the answer and the closer)."""
        import torch

        input_ids = torch.randint(0, vocab_size, (self.rows, self.length), generator=generator)
        labels = torch.full_like(input_ids, IGNORE)
        is_id, stop = self.statement_end
        for row in range(self.rows):
            count = int(torch.randint(1, self.statements + 1, (1,), generator=generator))
            values = torch.randint(0, vocab_size, (count,), generator=generator).tolist()
            answer = [token for i, value in enumerate(values) for token in (*(self.separator if i else ()), value)]
            tail = [*self.opener, *answer, *self.closer]
            room = self.length - len(tail) - 3 * count  # the statements, 3 tokens each, before the tail
            starts = sorted(torch.randperm(room + 1, generator=generator)[:count].tolist())
            for shift, (start, value) in enumerate(zip(starts, values, strict=True)):
                input_ids[row, start + 3 * shift : start + 3 * shift + 3] = torch.tensor([is_id, value, stop])
            input_ids[row, -len(tail) :] = torch.tensor(tail)
            answered = len(answer) + len(self.closer)
            labels[row, -answered:] = input_ids[row, -answered:]
        return input_ids, labels

    def loss(self, model, generator):
        return labelled_loss(model, *self.batch(generator, model.config.vocab_size))


def agent_format(agent: str, tokenizer, hf_model_type: str, agent_loops_yaml: str, retriever_url: str) -> ModelFormat:
    """The format of `agent` as the YAML configures it, read off a loop built the way verl builds it."""
    from verl_memagent.agent import instantiate_agent_loop, verl_trainer_config

    config = verl_trainer_config(prompt_length=PROMPT_LENGTH, response_length=RESPONSE_LENGTH)
    loop = instantiate_agent_loop(
        agent, config, None, tokenizer, hf_model_type, path=agent_loops_yaml, retriever_urls=retriever_url
    )
    return ModelFormat.of(loop)


def copy_pretrain(model_dir: Path, out: Path, steps: int, distant_steps: int, seed: int = 0) -> list[float]:
    """The tiny model after `steps` of copy pretraining on adjacent repeats (`copy_rows.copy_pretraining`,
    as the learning demo's start), then `distant_steps` on `COPY_ROWS`, saved to `out`: the one starting point
    every agent's warm start continues from. Two phases because induction heads form on adjacent repeats
    (loss 8.3 -> 2.4 in 800 steps) and not on distant ones from a random model (16.7 -> 16.0 in 1,300)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    losses = copy_pretraining(model, steps, seed=seed)
    losses += copy_pretraining(model, distant_steps, seed=seed, rows=COPY_ROWS)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out)
    return losses


def composed_options(steps: int = WARM_STEPS, decay_steps: int | None = None, **options) -> WarmStartOptions:
    """The composed task's warm-start options: the lr decaying to 0 over the last third of `steps` unless
    `decay_steps` says otherwise, one sample at a time (ReAct's contexts run to thousands of tokens:
    `supervised_steps`' `unpadded`), the state kept for a resume every 100 steps; `options` override."""
    decay = steps // 3 if decay_steps is None else decay_steps
    return WarmStartOptions(**{"steps": steps, "decay_steps": decay, "unpadded": True, "resume_every": 100, **options})


def warm_start_agent(
    agent: str,
    model_dir: Path,
    out: Path,
    task_dir: Path,
    retriever_url: str,
    agent_loops_yaml: str,
    options: WarmStartOptions,
    tasks_per_objective: int = TASKS_PER_OBJECTIVE,
    objectives: Sequence[int] = DEMO_OBJECTIVES,
    answer_rows: int = ANSWER_ROWS,
) -> list[float]:
    """`agent`'s warm start from `model_dir` (copy-pretrained): `tasks_per_objective` demonstrated questions
    at each k of `objectives` on the demonstration doors of `task_dir`, with `COPY_ROWS` and `answer_rows`
    answer rows in every step, trained as `options` say and saved to `out` with its build record."""

    def demonstrate(tokenizer, model_type: str) -> Demonstrations:
        model_format = agent_format(agent, tokenizer, model_type, agent_loops_yaml, retriever_url)
        scripts = demonstration_scripts(
            model_format, read_door_sets(task_dir).demos, tasks_per_objective, options.seed, objectives
        )
        lengths = (PROMPT_LENGTH, RESPONSE_LENGTH)
        samples = asyncio.run(
            scripted_samples(
                agent, scripts, tokenizer, agent_loops_yaml, *lengths, model_type, retriever_urls=retriever_url
            )
        )
        digested = samples[:DIGESTED_SAMPLES]
        contexts = {"samples": len(digested), "sha256": contexts_digest(digested)}
        answers = (AnswerRows.of(model_format, tokenizer, answer_rows),) if answer_rows else ()
        inputs = {"agent": agent, "tasks_per_objective": tasks_per_objective, "objectives": list(objectives)}
        return Demonstrations(samples, contexts, (COPY_ROWS, *answers), inputs)

    return warm_start(model_dir, out, demonstrate, options)
