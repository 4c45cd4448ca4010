"""Trajectory records of training steps and validations, read back from TransferQueue (docs/trajectories.md).

After a training step, before verl clears the batch, a sample of whole trajectories is read back
with the rewards and advantages the update used, and written to `<dir>/step_<N>.jsonl`; each
validation's sample goes to `<dir>/validation_step_<N>.jsonl`. Only the sampled trajectories' rows
are fetched and decoded, so the cost does not grow with the batch beyond parsing its keys.

Which trajectories: whole GRPO groups (all rollouts of a question, whose rewards set each other's
advantages), `per_step` trajectories in all. Training draws its groups at random, seeded by the
step; validation takes the questions with the lowest dataset index, so successive validations show
the same questions.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import transfer_queue as tq
from transfer_queue import KVBatchMeta

from verl_memagent.algo.sample_key import SampleKey
from verl_memagent.config_sections import typed_section
from verl_memagent.trajectories.build import ContextSample, build_record, is_recorded
from verl_memagent.trajectories.files import TRAJECTORIES_DIR, records_path, write_records
from verl_memagent.trajectories.schema import Source, TrajectoryRecord
from verl_memagent.trajectories.table import log_to_trackers

logger = logging.getLogger(__name__)

#: what a record needs of each sampled row; training adds the advantages
FIELDS = ["prompts", "responses", "extra_fields", "rm_scores", "data_source", "reward_model", "extra_info"]


@dataclass(frozen=True)
class TrajectoryRecordsConfig:
    """`trainer.trajectories` (give keys with `+trainer.trajectories.<key>=...`)."""

    #: trajectories recorded per training step, and per validation; 0 records none
    per_step: int = 16
    #: where the files go; default `<trainer.default_local_dir>/trajectories`
    dir: str | None = None

    @classmethod
    def from_trainer(cls, trainer) -> TrajectoryRecordsConfig:
        """`trainer.trajectories` of verl's `trainer` config, typed and checked."""
        config = typed_section("trainer.trajectories", trainer.get("trajectories", None) or {}, cls)
        if config.per_step < 0:
            raise ValueError(f"trainer.trajectories.per_step must be an integer >= 0, got {config.per_step!r}")
        return config

    def directory(self, trainer) -> Path:
        """Where the records go: `dir`, else `<trainer.default_local_dir>/trajectories`."""
        return Path(self.dir) if self.dir else Path(trainer.default_local_dir) / TRAJECTORIES_DIR


def groups_of(keys: Sequence[str], is_padding: Sequence[bool]) -> dict[str, list[list[int]]]:
    """Each prompt's (GRPO group's) trajectories as row positions in turn order, sessions in order, groups
    in order of first appearance; verl's keys (`SampleKey`) say where each row belongs."""
    groups: dict[str, dict[int, dict[int, int]]] = {}
    for row, (key, padding) in enumerate(zip(keys, is_padding, strict=True)):
        if not padding:
            sample = SampleKey.parse(key)
            groups.setdefault(sample.uid, {}).setdefault(sample.session, {})[sample.index] = row
    return {
        uid: [[turns[index] for index in sorted(turns)] for _, turns in sorted(sessions.items())]
        for uid, sessions in groups.items()
    }


def take_groups(groups: dict[str, list[list[int]]], uids: Sequence[str], limit: int) -> list[list[int]]:
    """The first `limit` trajectories of the groups `uids`, in that order, whole groups at a time."""
    chosen: list[list[int]] = []
    for uid in uids:
        if len(chosen) >= limit:
            break
        chosen += groups[uid][: limit - len(chosen)]
    return chosen


def fetch_records(
    keys: Sequence[str],
    trajectories: list[list[int]],
    partition_id: str,
    tokenizer,
    source: Source,
    step: int,
) -> list[TrajectoryRecord]:
    """Fetch the rows of `trajectories` (row positions into `keys`) and build their records."""
    wanted = [keys[row] for rows in trajectories for row in rows]
    if not wanted:
        return []
    select = FIELDS + (["advantages"] if source == "train" else [])
    data = tq.kv_batch_get(keys=wanted, partition_id=partition_id, select_fields=select)
    columns = {name: _column(data, name) for name in select}
    records, start = [], 0
    for rows in trajectories:
        indices, start = range(start, start + len(rows)), start + len(rows)
        if not all(is_recorded(columns["extra_fields"][i]) for i in indices):
            continue  # outputs of another agent loop (no turn log): not ours to record
        contexts = [
            ContextSample(
                prompt_ids=columns["prompts"][i],
                response_ids=columns["responses"][i],
                extra_fields=columns["extra_fields"][i],
                key=wanted[i],
                advantages=columns["advantages"][i] if "advantages" in columns else None,
            )
            for i in indices
        ]
        final = indices[-1]
        sample = SampleKey.parse(wanted[final])
        extra_info = columns["extra_info"][final] or {}
        try:
            record = build_record(
                contexts,
                tokenizer,
                source=source,
                step=step,
                data_source=columns["data_source"][final],
                golden_answers=(columns["reward_model"][final] or {}).get("ground_truth"),
                reward=float(sum(columns["rm_scores"][final])),
                reward_info=contexts[-1].extra_fields.get("reward_extra_info") or {},
                uid=sample.uid,
                session=sample.session,
                row_id=extra_info.get("id", extra_info.get("index")),
            )
        except (KeyError, TypeError, ValueError) as error:  # one odd trajectory costs its record only
            logger.warning("no trajectory record for %s: %r", wanted[final], error)
            continue
        records.append(record)
    return records


def _column(data, name: str) -> list[Any]:
    """One field of a TransferQueue batch as a list with one item per row (a nested tensor's rows as arrays)."""
    values = data[name]
    if hasattr(values, "unbind"):
        return [row.numpy() for row in values.unbind()]
    return list(values)


class TrajectoryRecorder:
    """Writes the records of a run: built by the trainer mixin from the run's config and tokenizer."""

    def __init__(self, config: TrajectoryRecordsConfig, directory: Path, tokenizer, loggers: Sequence[str]):
        self.config, self.directory, self.tokenizer, self.loggers = config, directory, tokenizer, list(loggers)

    @classmethod
    def from_trainer_config(cls, config, tokenizer) -> TrajectoryRecorder:
        """The recorder of a run: its `trainer.trajectories` section, directory and loggers."""
        records_config = TrajectoryRecordsConfig.from_trainer(config.trainer)
        loggers = config.trainer.get("logger", None) or []
        loggers = [loggers] if isinstance(loggers, str) else list(loggers)
        return cls(records_config, records_config.directory(config.trainer), tokenizer, loggers)

    def training_step(self, batch: KVBatchMeta, step: int) -> list[TrajectoryRecord]:
        """Record a sample of the step's trajectories (call before verl clears the batch)."""
        if not self.config.per_step or not batch.keys:
            return []
        groups = groups_of(batch.keys, [tag.get("is_padding", False) for tag in batch.tags])
        uids = [str(uid) for uid in np.random.default_rng(step).permutation(list(groups))]
        chosen = take_groups(groups, uids, self.config.per_step)
        records = fetch_records(batch.keys, chosen, batch.partition_id, self.tokenizer, "train", step)
        self.publish(records, "train", step)
        return records

    def validation(self, step: int) -> ValidationSample:
        """The sample of the validation at `step`, filled as verl hands out its batches."""
        return ValidationSample(self, step)

    def publish(self, records: list[TrajectoryRecord], source: Source, step: int) -> None:
        """Write `records` to their JSON-lines file and log them to the run's trackers (wandb: a table)."""
        if records:
            write_records(records_path(self.directory, source, step), records)
            log_to_trackers(self.loggers, records, source, step)


class ValidationSample:
    """The records of one validation: `add` each batch as it is handed out, `write` at the end. Keeps the
    `per_step` trajectories of the lowest dataset indices seen over all batches."""

    def __init__(self, recorder: TrajectoryRecorder, step: int):
        self.recorder, self.step = recorder, step
        self.kept: list[tuple[tuple, TrajectoryRecord]] = []

    def add(self, batch: KVBatchMeta) -> None:
        """Keep the lowest-index trajectories among those kept so far and this batch's."""
        limit = self.recorder.config.per_step
        if not limit or not batch.keys:
            return
        groups = groups_of(batch.keys, [tag.get("is_padding", False) for tag in batch.tags])
        firsts = [members[0][0] for members in groups.values()]
        keys = [batch.keys[row] for row in firsts]
        data = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=["index"])
        index_of = dict(zip(groups, (int(index) for index in _column(data, "index")), strict=True))
        uids = sorted(groups, key=lambda uid: (index_of[uid], uid))
        chosen = take_groups(groups, uids, limit)
        records = fetch_records(
            batch.keys, chosen, batch.partition_id, self.recorder.tokenizer, "validation", self.step
        )
        ranked = [((index_of[record.uid], record.uid, record.session), record) for record in records]
        self.kept = sorted(self.kept + ranked, key=lambda item: item[0])[:limit]

    def write(self) -> list[TrajectoryRecord]:
        """Publish the kept records and return them."""
        records = [record for _, record in self.kept]
        self.recorder.publish(records, "validation", self.step)
        return records
