"""The sweep's records: one per cell (agent, phase, RL seed, k objectives, evaluation door set), each with
what it was measured on and grown from. Read back to resume a sweep and to report it."""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from verl_memagent.trajectories.files import TRAJECTORIES_DIR, records_path

AGENTS = ("memsearcher", "mem1", "react")
OBJECTIVES = (1, 2, 4, 8)
#: the dev split, on which every setting is chosen: door sets and the questions composed from each at every k
EVAL_TASKS = {"dev": 24, "unseen": 16}
#: the test split, scored only for the final figures
TEST_TASKS = {"test": 24}
#: objectives per RL question: two, as MEM1 trains; other sets (`--rl-objectives`) are phases of their own
RL_OBJECTIVES = (2,)
#: the RL regimes: MEM1's recipe (k = 2 on the 96 RL doors) and the papers' regime at CPU size (docs/papers_claim.md)
REGIMES = ("mem1", "fresh")


def rl_suffix(rl_objectives: tuple[int, ...]) -> str:
    """'' for MEM1's RL set (k = 2), whose names predate the option; `_k1-2-4-8` for another."""
    return "" if tuple(rl_objectives) == RL_OBJECTIVES else "_k" + "-".join(str(k) for k in rl_objectives)


def phase_label(phase: str, rl_objectives: Sequence[int] | None, regime: str = "mem1", settings: str = "") -> str:
    """A cell's phase: its RL set named where it is not MEM1's (`after_rl`, `after_rl_k1-2-4-8`); the papers'
    regime by name and its settings' name, if any (`after_rl_fresh`, `after_rl_fresh_lr3e-5`)."""
    if phase != "after_rl":
        return phase
    if regime == "mem1":
        return phase + rl_suffix(tuple(rl_objectives))
    return f"{phase}_{regime}" + (f"_{settings}" if settings else "")


def record_phase(record: dict) -> str:
    """A record's phase label (records before the papers' regime carry no regime: MEM1's)."""
    return phase_label(
        record["phase"], record.get("rl_objectives"), record.get("regime") or "mem1", record.get("settings_name") or ""
    )


def file_digest(path: Path) -> str:
    """The first 16 hex digits of the file's sha256: which warm start a record's policy grew from (a warm
    start built on another CPU is another model, so a sweep resumed elsewhere must not mix them)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def retention_shares(trajectories: list[dict]) -> dict[str, float | None]:
    """What the memories held of what the searches had shown, pooled over every memory-writing turn of
    the eval's trajectory records: by answers, and by statements, the door with its password
    (`trajectories/retention.py`); None for an agent that writes no memory (ReAct)."""
    turns = [turn for record in trajectories for turn in record["turns"] if turn.get("answers_read") is not None]

    def share(held: str, read: str) -> float | None:
        counted = [turn for turn in turns if turn.get(read) is not None]
        total = sum(turn[read] for turn in counted)
        return sum(turn[held] for turn in counted) / total if total else None

    return {
        "memory_retention": share("answers_held", "answers_read"),
        "memory_retention_exact": share("statements_held", "statements_read"),
    }


def cell_records(
    agent: str, phase: str, seed: int | None, k: int, door_sets: list[str], out: Path, wall_s: float
) -> list[dict]:
    """One record per evaluation set of an eval run at k objectives (its summary, examples and trajectory
    records)."""
    summary = json.loads((out / "summary.json").read_text())
    examples = [json.loads(line) for line in (out / "examples.jsonl").read_text().splitlines()]
    records_file = records_path(out / TRAJECTORIES_DIR, "eval")
    trajectories = [json.loads(line) for line in records_file.read_text().splitlines()]
    tasks = sum(summary["datasets"].values())
    records = []
    for name in door_sets:
        scores = summary["agents"][agent]["datasets"][f"{name}_k{k}"]
        mine = [e for e in examples if e["dataset"] == f"{name}_k{k}"]
        contexts = [c for e in mine for c in e["contexts"]]
        records.append(
            {
                "agent": agent,
                "objectives": k,
                "seed": seed,
                "phase": phase,
                "door_set": name,
                "questions": scores["n"],
                "em": scores["em_fraction"],
                "em_all": scores["em"],
                "peak_context_tokens": scores["mean_peak_context_tokens"],
                "max_peak_context_tokens": scores["peak_context_tokens"],
                "prefill_tokens_per_question": sum(c["prefill_tokens"] for c in contexts) / len(mine),
                "decoded_tokens_per_question": sum(c["generated_tokens"] for c in contexts) / len(mine),
                "seconds_per_question": wall_s / tasks,
                "turns": scores["mean_turns"],
                "answered": scores["answered"],
                "finish_reasons": scores["finish_reasons"],
                **retention_shares([t for t in trajectories if t["data_source"] == f"{name}_k{k}"]),
            }
        )
    return records


def check_one_warm_start(records: list[dict]) -> None:
    """Refuse an agent's records grown from two warm starts: two builds' policies are different models,
    and a mean over both is of neither."""
    starts = defaultdict(set)
    for r in records:
        starts[r["agent"]].add(r["warm_start_sha256"])
    if mixed := {agent: sorted(shas) for agent, shas in starts.items() if len(shas) > 1}:
        raise ValueError(f"records from more than one warm start {mixed}: keep one build's records in the JSON")


def report_line(records: list[dict], agent: str, phase: str, seed: int) -> str:
    mine = [
        r for r in records if (r["agent"], record_phase(r), r["seed"], r["door_set"]) == (agent, phase, seed, "dev")
    ]
    ems = " ".join(f"k{r['objectives']} {r['em']:.2f}" for r in sorted(mine, key=lambda r: r["objectives"]))
    return f"{agent} seed {seed} {phase}, dev EM per objective: {ems}"
