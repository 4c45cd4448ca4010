"""Values the docs quote, checked against the files they come from, so that neither changes alone.

Each check renders the sentence a doc states from the source's current value (a recipe YAML, a
launcher's default) and looks for it in the doc: change the value and the doc must change too.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
CPU = REPO / "recipes" / "cpu"


def yaml_of(path: Path):
    return yaml.safe_load(path.read_text())


def agent(entries: list[dict], name: str) -> dict:
    return next(entry for entry in entries if entry["name"] == name)


def shell_default(script: Path, variable: str) -> str:
    """The default of `VAR=${VAR:-default}` in a bash launcher."""
    match = re.search(rf"^{variable}=\$\{{{variable}:-([^}}]+)\}}", script.read_text(), re.MULTILINE)
    assert match, f"{script.name} sets no default for {variable}"
    return match.group(1)


def lr_text(lr: float) -> str:
    """1.0e-4 as the docs write it: 1e-4."""
    mantissa, exponent = f"{lr:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def learn_codes_sentences(cpu: Path = CPU) -> list[str]:
    config = yaml_of(cpu / "learn_codes.yaml")
    actor = config["actor_rollout_ref"]["actor"]
    questions, samples = config["data"]["train_batch_size"], config["actor_rollout_ref"]["rollout"]["n"]
    updates = questions // actor["ppo_mini_batch_size"]
    launcher = cpu / "learn_codes.sh"
    names = ("SEED", "START", "EVAL_SAMPLES", "BUILD_SEED", "COPY_STEPS", "WARM_STEPS")
    defaults = {name: shell_default(launcher, name) for name in names}
    return [
        f"{questions} questions x {samples} trajectories per step, {config['trainer']['total_training_steps']} steps",
        f"lr {lr_text(actor['optim']['lr'])}, {updates} actor updates per step",
        " ".join(f"{name}={defaults[name]}" for name in names[:3]),
        f"BUILD_SEED={defaults['BUILD_SEED']} COPY_STEPS={defaults['COPY_STEPS']} WARM_STEPS={defaults['WARM_STEPS']}",
        f"`WARM_STEPS={defaults['WARM_STEPS']}`",
        f"`EVAL_SAMPLES` ({defaults['EVAL_SAMPLES']}) passes",
    ]


def agent_loops_sentences() -> list[str]:
    memsearcher = agent(yaml_of(CPU / "agent_loops.yaml"), "memsearcher")
    learn_codes = agent(yaml_of(CPU / "learn_codes_agent_loops.yaml"), "memsearcher")
    return [
        f"({memsearcher['max_turns']} turns, {memsearcher['max_new_tokens']} new tokens, "
        f"{memsearcher['memory_max_tokens']}-token memory, {memsearcher['topk']} documents)",
        "with one document per search" if learn_codes["topk"] == 1 else f"with {learn_codes['topk']} documents",
    ]


def smoke_sentences() -> list[str]:
    smoke = yaml_of(CPU / "smoke.yaml")
    actor = smoke["actor_rollout_ref"]["actor"]
    return [
        f"{smoke['data']['train_batch_size']} questions x {smoke['actor_rollout_ref']['rollout']['n']} trajectories"
        f" per step, {smoke['trainer']['total_training_steps']} steps",
        f"KL loss ({actor['kl_loss_type']} {actor['kl_loss_coef']}), entropy {actor['entropy_coeff']}, "
        f"clip {actor['clip_ratio']}",
    ]


@pytest.mark.parametrize("sentence", learn_codes_sentences() + agent_loops_sentences() + smoke_sentences())
def test_docs_cpu_states_the_recipes_values(sentence):
    assert sentence in " ".join((REPO / "docs" / "cpu.md").read_text().split()), sentence


def test_a_value_changed_without_its_doc_is_caught(tmp_path):
    for name in ("learn_codes.yaml", "learn_codes.sh"):
        (tmp_path / name).write_text((CPU / name).read_text())
    config = yaml_of(tmp_path / "learn_codes.yaml")
    config["actor_rollout_ref"]["actor"]["optim"]["lr"] = 3.0e-4
    (tmp_path / "learn_codes.yaml").write_text(yaml.safe_dump(config))
    launcher = tmp_path / "learn_codes.sh"
    launcher.write_text(re.sub(r"WARM_STEPS:-\d+", "WARM_STEPS:-999", launcher.read_text()))
    doc = " ".join((REPO / "docs" / "cpu.md").read_text().split())
    missing = [sentence for sentence in learn_codes_sentences(tmp_path) if sentence not in doc]
    expected = ["lr 3e-4, 4 actor updates per step", "BUILD_SEED=0 COPY_STEPS=800 WARM_STEPS=999", "`WARM_STEPS=999`"]
    assert missing == expected
