"""A training step's reward and GRPO signal per data source, for batches that mix tasks.

MEM1's composed questions at several k share a batch (`data_source` `multi_objective_k`); verl's
`critic/score/mean` pools them, so a k whose reward falls while another's rises shows nothing. Per
source: the mean trajectory reward, and the share of prompt groups whose trajectories all scored the
same, which a group-normalised advantage (GRPO) gives no gradient. Keys `train/<source>/reward/mean`
and `train/<source>/groups_all_equal`, beside verl's metrics of the step.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from verl_memagent.algo.sample_key import SampleKey


def source_metrics(keys: Sequence[str], sources: Sequence[str], scores: Sequence[float]) -> dict[str, float]:
    """Per data source, from the step's rows (verl's keys, each row's `data_source` and score; no padding
    rows): each trajectory counts once, with the score of its last context, where the reward sits."""
    last: dict[tuple[str, int], tuple[int, str, float]] = {}
    for key, source, score in zip(keys, sources, scores, strict=True):
        parsed = SampleKey.parse(key)
        seen = last.get((parsed.uid, parsed.session))
        if seen is None or parsed.index > seen[0]:
            last[(parsed.uid, parsed.session)] = (parsed.index, source, float(score))
    groups: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for (uid, _), (_, source, score) in last.items():
        groups[source][uid].append(score)
    metrics = {}
    for source, by_uid in sorted(groups.items()):
        rewards = [score for scores in by_uid.values() for score in scores]
        metrics[f"train/{source}/reward/mean"] = sum(rewards) / len(rewards)
        metrics[f"train/{source}/groups_all_equal"] = sum(len(set(s)) == 1 for s in by_uid.values()) / len(by_uid)
    return metrics
