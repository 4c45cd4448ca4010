"""An RL run's curves, kept beside the sweep's records: what the run did step by step, in verl's metrics.

From the run's `metrics.jsonl` (one line a step, verl's trackers), the figures that show where RL goes
right or wrong while it runs: the reward and the share of all-alike groups per data source (`train/...`,
`algo.source_metrics`: per k on mixed batches), the validation's figures per dev source (`val-core/`
rewards and `val-aux/<set>_k<k>/...` EM per objective, finish shares, exact memory retention, searches:
greedy, every `trainer.test_freq` steps), the KL to the reference and the policy's movement
(`actor/kl_loss`, `actor/ppo_kl`, `actor/grad_norm`, `actor/lr`), the pooled score, the agents' finish
shares (`agent/finish/...`: answered, out of turns or tokens, a broken answer or tool call), memory
retention, the multi-context estimator's counts (`multi_context/...`: groups whose rewards are all alike,
turns penalised as broken, actor steps taken and skipped), and the step's and validation's seconds. One
JSON line a step, `{"step": n, ...}`.
"""

from __future__ import annotations

import json
from pathlib import Path

#: prefixes of the metrics a curve keeps
KEPT = ("train/", "val-core/", "actor/kl_loss", "actor/ppo_kl", "actor/grad_norm", "actor/lr", "critic/score/mean")
KEPT += ("agent/finish/", "agent/searches/mean", "agent/memory_retention", "multi_context/", "timing_s/step")
KEPT += ("timing_s/testing",)
#: of the validation's own figures per dev source, the ones a curve keeps: EM per objective, finishes, retention
VALIDATION = ("/em_fraction/mean@1", "/agent/finish/", "/agent/memory_retention_exact/mean", "/agent/searches/mean")


def kept(key: str) -> bool:
    """Whether a curve keeps metric `key` (a whole-run figure, not one of the per-turn retention shares)."""
    if "/turn_" in key:
        return False
    return key.startswith(KEPT) or (key.startswith("val-aux/") and any(part in key for part in VALIDATION))


def curve(metrics: Path) -> list[dict]:
    """The kept figures of every step of a run's `metrics.jsonl`."""
    steps = []
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        figures = {key: value for key, value in record["data"].items() if kept(key)}
        steps.append({"step": record["step"], **figures})
    return steps


def save_curve(metrics: Path, out: Path) -> None:
    """Write the run's curve to `out` (JSON lines), replacing what was there."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(step, sort_keys=True) + "\n" for step in curve(metrics)))
