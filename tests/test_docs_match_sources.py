"""Values the docs quote, checked against the files they come from, so that neither changes alone.

Each check renders the sentence or table cell a doc states from the source's current value (a recipe
YAML, a launcher's default, a dataclass default, an argparse default, the released values) and looks
for it in the doc: change the value and the doc must change too. Each has a test that a changed
value is caught. Docs: learn_codes.md, cpu.md, agents.md (settings, fields, finish reasons, metrics),
retriever.md (`serve`'s options), fidelity.md (released values). The module table is docs/design.md's,
checked by tests/test_layout.py.
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


def learn_codes_agent_sentences() -> list[str]:
    learn_codes = agent(yaml_of(CPU / "learn_codes_agent_loops.yaml"), "memsearcher")
    return ["with one document per search" if learn_codes["topk"] == 1 else f"with {learn_codes['topk']} documents"]


def agent_loops_sentences() -> list[str]:
    memsearcher = agent(yaml_of(CPU / "agent_loops.yaml"), "memsearcher")
    return [
        f"({memsearcher['max_turns']} turns, {memsearcher['max_new_tokens']} new tokens, "
        f"{memsearcher['memory_max_tokens']}-token memory, {memsearcher['topk']} documents)",
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


def words(doc: str) -> str:
    """A doc's text with its line breaks as spaces."""
    return " ".join((REPO / "docs" / doc).read_text().split())


@pytest.mark.parametrize("sentence", learn_codes_sentences() + learn_codes_agent_sentences())
def test_docs_learn_codes_states_the_learning_demos_values(sentence):
    assert sentence in words("learn_codes.md"), sentence


@pytest.mark.parametrize("sentence", agent_loops_sentences() + smoke_sentences())
def test_docs_cpu_states_the_recipes_values(sentence):
    assert sentence in words("cpu.md"), sentence


def test_a_value_changed_without_its_doc_is_caught(tmp_path):
    for name in ("learn_codes.yaml", "learn_codes.sh"):
        (tmp_path / name).write_text((CPU / name).read_text())
    config = yaml_of(tmp_path / "learn_codes.yaml")
    config["actor_rollout_ref"]["actor"]["optim"]["lr"] = 3.0e-4
    (tmp_path / "learn_codes.yaml").write_text(yaml.safe_dump(config))
    launcher = tmp_path / "learn_codes.sh"
    launcher.write_text(re.sub(r"WARM_STEPS:-\d+", "WARM_STEPS:-999", launcher.read_text()))
    doc = words("learn_codes.md")
    missing = [sentence for sentence in learn_codes_sentences(tmp_path) if sentence not in doc]
    expected = ["lr 3e-4, 4 actor updates per step", "BUILD_SEED=0 COPY_STEPS=800 WARM_STEPS=999", "`WARM_STEPS=999`"]
    assert missing == expected


# ---- markdown tables ------------------------------------------------------------------------------


def section(doc: str, heading: str) -> str:
    """The text under the heading that starts with `heading` (any level), up to the next heading."""
    match = re.search(rf"^#+ {re.escape(heading)}.*?$(.*?)(?=^#+ |\Z)", doc, re.MULTILINE | re.DOTALL)
    assert match, f"no heading {heading!r}"
    return match.group(1)


def table_rows(text: str) -> list[list[str]]:
    """The body rows of the first markdown table in `text`, as stripped cells."""
    lines = text[text.index("\n|") + 1 :].splitlines()
    table = lines[: next((i for i, line in enumerate(lines) if not line.startswith("|")), len(lines))]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in table[2:]]


def code_spans(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


# ---- docs/agents.md: the settings table, the output fields and finish reasons, the metrics ---------

AGENTS_MD = REPO / "docs" / "agents.md"


def yaml_text(value) -> str:
    """A setting's value as the docs write it in YAML: null, true, 0.5, a list joined by commas."""
    if isinstance(value, list):
        return ", ".join(yaml_text(item) for item in value)
    if value is None or isinstance(value, bool):
        return yaml.safe_dump(value).split("\n")[0]
    return f"{value:g}" if isinstance(value, float) else str(value)


def settings_cell(key: str, default, entries: list[dict]) -> str:
    """`default` (YAML: agent `value`, ...) for the agent-loop YAML's entries that set another value."""
    others = [
        f"{entry['name']} `{yaml_text(entry[key])}`"
        for entry in entries
        if key in entry and entry[key] != default and not str(entry[key]).startswith("${")
    ]
    return f"`{yaml_text(default)}`" + (f" (YAML: {', '.join(others)})" if others else "")


def settings_table_problems(doc: str, defaults, entries: list[dict]) -> list[str]:
    """Rows of the settings table whose default cell does not state `defaults` (an AgentSettings) and
    the YAML `entries`, and the settings the table does not name once."""
    from dataclasses import fields

    names = [field.name for field in fields(defaults)]
    rows = table_rows(section(doc, "Settings"))
    named = [key for row in rows for key in code_spans(row[0])]
    problems = [f"{name}: named {named.count(name)} times" for name in names if named.count(name) != 1]
    problems += [f"{key}: not a setting" for key in named if key not in names]
    for row in rows:
        keys = [key for key in code_spans(row[0]) if key in names]
        values = {key: getattr(defaults, key) for key in keys}
        if any(isinstance(value, dict) for value in values.values()):  # per agent and style: prompts.yaml
            expected = "the agent's, per `prompt_style` (`prompts.yaml`)"
        else:
            expected = ", ".join(settings_cell(key, value, entries) for key, value in values.items())
        if not row[1].startswith(expected):
            problems.append(f"{', '.join(keys)}: the doc says {row[1]!r}, the code {expected!r}")
    return problems


def agent_loop_entries() -> list[dict]:
    return yaml_of(REPO / "verl_memagent" / "agent" / "agent_loops.yaml")


def test_docs_agents_settings_table_states_the_defaults():
    from verl_memagent.agent.settings import AgentSettings

    assert settings_table_problems(AGENTS_MD.read_text(), AgentSettings(), agent_loop_entries()) == []


def test_a_changed_setting_default_is_caught():
    from dataclasses import replace

    from verl_memagent.agent.settings import AgentSettings

    entries = agent_loop_entries()
    agent(entries, "mem1")["max_turns"] = 9
    problems = settings_table_problems(AGENTS_MD.read_text(), replace(AgentSettings(), topk=7), entries)
    assert [problem.split(":")[0] for problem in problems] == ["topk", "max_turns"]


def names_outside(text: str, known: set[str], others: set[str]) -> list[str]:
    """Snake-case names in `text`'s code spans that are neither `known` nor `others`."""
    names = {span for span in code_spans(text) if re.fullmatch(r"[a-z]+(_[a-z]+)+|[a-z]+", span)}
    return sorted(names - known - others)


#: names of verl, settings and functions the two sections mention beside the fields and reasons
VERL_AND_SETTINGS = {"min_global_steps", "max_global_steps", "metrics", "generate_sequences", "tool_calls"}


def test_docs_agents_names_only_output_fields_and_finish_reasons_that_exist():
    from verl_memagent.output_fields import FINISH_REASONS, OUTPUT_FIELDS

    doc = AGENTS_MD.read_text()
    outputs = section(doc, "What every output carries")
    assert names_outside(outputs, set(OUTPUT_FIELDS), VERL_AND_SETTINGS) == []
    outcomes = section(doc, "Outcomes: every trajectory ends with one")
    assert names_outside(outcomes, set(FINISH_REASONS), {"retriever_errors"}) == []
    # and a renamed one is caught
    assert names_outside(outcomes, set(FINISH_REASONS) - {"max_turns"}, {"retriever_errors"}) == ["max_turns"]


def metric_names(text: str) -> set[str]:
    """The metric names of the table's first column, `a/{mean,max}` expanded."""
    names = set()
    for row in table_rows(text):
        for span in code_spans(row[0]):
            stem, brace, options = span.partition("{")
            names |= {stem + option for option in options.rstrip("}").split(",")} if brace else {span}
    return names


def test_docs_agents_metrics_table_is_what_the_trainers_log():
    from verl_memagent.algo.agent_metrics import agent_metrics
    from verl_memagent.output_fields import OutputField

    context = {field: 1 for field in vars(OutputField).values() if isinstance(field, str)}
    context |= {OutputField.TRAJECTORY_ID: "t", OutputField.FINISH_REASON: "answer", OutputField.PENALISED: False}
    context[OutputField.QUESTION] = "What is the password of station a1 at gate b1?"
    statement = "The password of station a1 at gate b1 is album."
    search = {"query": "q", "passages": [], "failed": False, "text": statement}
    span = {"start": 0, "end": 1, "finish": "eos"}
    context[OutputField.TURN_LOG] = [
        {"calls": [span, span], "search": search, "memory_before": "", "memory": statement}
    ]
    logged = set(agent_metrics([context], ground_truths=[["album"]]))
    documented = metric_names(section(AGENTS_MD.read_text(), "Agent metrics in verl's trackers"))
    assert documented == logged, documented ^ logged


# ---- docs/retriever.md: `serve`'s options and their defaults, read from its parser ------------------

RETRIEVER_MD = REPO / "docs" / "retriever.md"


def serve_options() -> dict[str, object]:
    """Each option of `python -m retriever_server serve` -> its default, from the parser itself."""
    import argparse

    from retriever_server.__main__ import _parser

    commands = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    serve = commands.choices["serve"]
    return {action.option_strings[0]: action.default for action in serve._actions if action.dest != "help"}


def default_texts(flag: str, value) -> list[str]:
    """How docs/retriever.md may write a default: 65,536 or 8000, 32 MiB, 10 (for 10.0)."""
    if isinstance(value, int) and flag.endswith("-bytes"):
        for unit, size in (("MiB", 2**20), ("KiB", 2**10)):
            if value % size == 0:
                return [f"{value // size} {unit}"]
    if isinstance(value, float):
        return [f"{value:g}"]
    return [f"{value:,}", str(value)] if isinstance(value, int) else [str(value)]


def find_value(texts: list[str], text: str, start: int = 0) -> re.Match | None:
    """The first of `texts` in `text` from `start`, as a whole value (not part of a longer number or word)."""
    pattern = "|".join(re.escape(t) for t in texts)
    return re.compile(rf"(?<![\w.,\-])(?:{pattern})(?![\w]|[.,]\d)").search(text, start)


def serve_table_problems(doc: str, options: dict[str, object]) -> list[str]:
    """Options the "Serve it" section does not name, and defaults its table does not state: each row's
    default cell must hold its options' defaults in the order of the options (an option without a
    default, computed at start-up, is described in words)."""
    text = section(doc, "Serve it")
    named = set(re.findall(r"--[a-z][a-z0-9-]*", text))
    problems = [f"{flag}: not in docs/retriever.md" for flag in options if flag not in named]
    for row in table_rows(text):
        position = 0
        for flag in re.findall(r"--[a-z0-9-]+", row[0]):
            if flag not in options:
                problems.append(f"{flag}: no such option of serve")
                continue
            if options[flag] is None:
                continue
            expected = default_texts(flag, options[flag])
            found = find_value(expected, row[1], position)
            if found is None:
                problems.append(f"{flag}: the doc says {row[1]!r}, the default is {expected[0]}")
            else:
                position = found.end()
    return problems


def test_docs_retriever_states_every_serve_option_and_its_default():
    assert serve_table_problems(RETRIEVER_MD.read_text(), serve_options()) == []


def test_a_changed_serve_default_is_caught():
    options = serve_options() | {"--max-body-bytes": 16 * 2**20, "--cache-size": 5_000, "--new-flag": 1}
    problems = serve_table_problems(RETRIEVER_MD.read_text(), options)
    assert [problem.split(":")[0] for problem in problems] == ["--new-flag", "--max-body-bytes", "--cache-size"]


# ---- docs/fidelity.md: the released values, from tests/released_values.py ---------------------------

FIDELITY_MD = REPO / "docs" / "fidelity.md"
FIDELITY_SECTION = {"memsearcher": "MemSearcher", "mem1": "MEM1"}


def fidelity_texts(key: str, value) -> list[str]:
    """How docs/fidelity.md may write a value: `key: true` / `key: null` for flags and nulls (the key
    or its last part), 1e-6, 0.001, 1 or 1.0, .inf, or the text itself."""
    if value is None or isinstance(value, bool):
        return [f"{name}: {yaml_text(value)}" for name in (key, key.rsplit(".", 1)[-1])]
    if isinstance(value, float):
        if value == float("inf"):
            return [".inf"]
        return [lr_text(value)] if 0 < abs(value) < 1e-3 else [f"{value:g}", repr(value)]
    return [str(value)]


def fidelity_problems(doc: str, by_row: dict[str, dict[str, dict]]) -> list[str]:
    """Values not stated in their row of docs/fidelity.md (its released and ours cells, file:line
    references left out): `by_row` is agent -> row -> key -> value."""
    problems = []
    for agent, rows in by_row.items():
        table = {row[0]: row for row in table_rows(section(doc, FIDELITY_SECTION[agent]))}
        for name, values in rows.items():
            if name not in table:
                problems.append(f"{agent} {name!r}: no such row")
                continue
            text = re.sub(r"`[^`]*:\d[^`]*`", "", f"{table[name][1]} {table[name][2]}")
            for key, value in values.items():
                if find_value(fidelity_texts(key, value), text) is None:
                    problems.append(f"{agent} {key}: {fidelity_texts(key, value)[0]} not in the row {name!r}")
    return problems


def test_docs_fidelity_states_the_released_values():
    from released_values import RELEASED_AGENT_BY_ROW, RELEASED_BY_ROW

    doc = FIDELITY_MD.read_text()
    assert fidelity_problems(doc, RELEASED_BY_ROW) == []
    assert fidelity_problems(doc, RELEASED_AGENT_BY_ROW) == []


def test_a_changed_released_value_is_caught():
    import copy

    from released_values import RELEASED_AGENT_BY_ROW, RELEASED_BY_ROW

    values = copy.deepcopy(RELEASED_BY_ROW)
    values["memsearcher"]["lr, warm-up"]["actor_rollout_ref.actor.optim.lr"] = 3e-6
    values["mem1"]["KL"]["algorithm.use_kl_in_reward"] = False
    settings = copy.deepcopy(RELEASED_AGENT_BY_ROW)
    settings["mem1"]["turns"]["max_turns"] = 7
    doc = FIDELITY_MD.read_text()
    assert fidelity_problems(doc, values) == [
        "memsearcher actor_rollout_ref.actor.optim.lr: 3e-6 not in the row 'lr, warm-up'",
        "mem1 algorithm.use_kl_in_reward: algorithm.use_kl_in_reward: false not in the row 'KL'",
    ]
    assert fidelity_problems(doc, settings) == ["mem1 max_turns: 7 not in the row 'turns'"]
