"""A run's files across a restart: what a resumed run keeps of the run it continues.

verl's resume (`trainer.resume_mode: auto`, its default) reloads the latest checkpoint: the model,
optimizer, lr schedule and RNG states of actor and critic, the dataloader's position and the global
step. The run's own files are left to chance, and this mixin makes them follow the checkpoint:

- *Metrics.* verl's file logger (`trainer.logger` `file`, `VERL_FILE_LOGGER_PATH`) opens its file for
  writing at every start, so a resumed run lost every line written before the restart. Here the
  file keeps the lines of the checkpointed steps (later ones belonged to steps that run again) and
  the run appends to it.
- *Trajectory records* of steps after the checkpoint are removed, for the same reason.
- *A checkpoint follows its step's metrics*: verl saves a step's checkpoint before it validates and
  logs the step, so a run killed in between resumed after a step whose metrics line and records were
  never written. The save verl asks for is made right after the step is logged. For the async trainers
  this also means their TransferQueue snapshot (the prompt groups in flight) no longer holds the rows
  the step trained: verl clears them just before the log, and a snapshot taken earlier restored them
  into the queue of the resumed run, where nothing would ever sample or clear them.
- *In-flight groups, counted* (async trainers): verl restores the groups whose rollouts had ended and
  re-issues the pending and running ones from their prompts, discarding the trajectories those had
  finished; the first step after a resume logs how many (`training/resume/...`, `in_flight_at_checkpoint`).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import transfer_queue as tq
from verl.utils import tracking

from verl_memagent.algo.sample_key import SampleKey
from verl_memagent.trajectories.files import step_of_record_file

#: the replay buffer's statuses of a prompt group whose rollouts have not all ended
IN_FLIGHT = ("pending", "running")


def metrics_file(config) -> Path | None:
    """The file verl's `file` logger writes, or None when the run does not log to a file."""
    loggers = config.trainer.get("logger", None) or []
    if "file" not in ([loggers] if isinstance(loggers, str) else list(loggers)):
        return None
    return _file_logger_path(config.trainer.project_name, config.trainer.experiment_name)


def _file_logger_path(project_name: str, experiment_name: str) -> Path:
    """Where `verl.utils.tracking.FileLogger` writes (utils/tracking.py:534-539)."""
    if os.getenv("VERL_FILE_LOGGER_PATH"):
        return Path(os.environ["VERL_FILE_LOGGER_PATH"])
    root = Path(os.path.expanduser(os.getenv("VERL_FILE_LOGGER_ROOT", ".")))
    return root / project_name / f"{experiment_name}.jsonl"


def keep_metrics_until(path: Path, step: int) -> int:
    """Rewrite the metrics file with its lines of steps <= `step` only (atomically); how many were kept."""
    if not path.exists():
        return 0
    kept = [line for line in path.read_text(encoding="utf-8").splitlines() if json.loads(line)["step"] <= step]
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")
    partial.replace(path)
    return len(kept)


def remove_records_after(directory: Path, step: int) -> list[Path]:
    """Delete the training and validation record files of steps after `step`; the paths removed."""
    removed = [path for path in directory.glob("*.jsonl") if (step_of_record_file(path) or 0) > step]
    for path in removed:
        path.unlink()
    return removed


def in_flight_at_checkpoint(listing: dict[str, dict]) -> dict[str, int]:
    """What an async run's checkpoint held in flight, from its restored TransferQueue partition (`listing`:
    each key's tag, as `tq.kv_list` gives them). A prompt group is the key `{uid}` (tag `is_prompt`), its
    trajectories' rows `{uid}_{session}_{turn}`: groups whose rollouts had all ended are restored as they were
    and trained as before the kill; pending or running ones are re-issued whole from their prompts, the
    trajectories they had already finished discarded (verl's `_reissue_inflight_prompts`)."""
    prompts = {key: tag for key, tag in listing.items() if tag.get("is_prompt", False)}
    in_flight = {key for key, tag in prompts.items() if tag.get("status") in IN_FLIGHT}
    samples = [SampleKey.parse(key) for key in listing.keys() - prompts.keys()]
    finished = {sample.trajectory for sample in samples if sample.uid in in_flight}
    return {
        "training/resume/restored_groups": len(prompts) - len(in_flight),
        "training/resume/reissued_groups": len(in_flight),
        "training/resume/discarded_trajectories": len(finished),
    }


class _AppendingFileLogger(tracking.FileLogger):
    """verl's file logger, appending to its file where verl's empties it."""

    def __init__(self, project_name: str, experiment_name: str):
        self.project_name, self.experiment_name = project_name, experiment_name
        path = _file_logger_path(project_name, experiment_name)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.filepath = str(path)
        self.fp = open(path, "ab", buffering=0)  # noqa: SIM115 (closed by verl's finish())


@contextlib.contextmanager
def appending_file_logger() -> Iterator[None]:
    """While the block runs, the trackers verl creates append to the metrics file."""
    original = tracking.FileLogger
    tracking.FileLogger = _AppendingFileLogger
    try:
        yield
    finally:
        tracking.FileLogger = original


class _LogThenCheckpoint:
    """verl's `Tracking`: each `log` is followed by the checkpoint the trainer deferred in that step."""

    def __init__(self, tracking_, trainer):
        self._tracking, self._trainer = tracking_, trainer

    def log(self, data, step, **kwargs):
        self._tracking.log(data=data, step=step, **kwargs)
        self._trainer._save_deferred_checkpoint()

    def __getattr__(self, name):
        return getattr(self._tracking, name)


class ResumeMixin:
    """Put in front of one of verl's V1 trainers (with `TrajectoryRecordsMixin`)."""

    base_mode: str
    _checkpoint_deferred = False
    _checkpoint_due = False
    _resume_metrics: dict[str, int] = {}

    def _load_checkpoint(self):
        super()._load_checkpoint()
        path = metrics_file(self.config)
        if path is not None:
            keep_metrics_until(path, self.global_steps)  # a fresh run (step 0) starts an empty file, as verl's
        remove_records_after(Path(self.trajectory_recorder.directory), self.global_steps)

    def fit(self, agent_loop_manager):
        """verl's training loop, its file logger appending to the metrics file instead of emptying it: a
        resumed run keeps the steps before its checkpoint (`_load_checkpoint` cut the file there)."""
        with appending_file_logger():
            return super().fit(agent_loop_manager)

    def _reissue_inflight_prompts(self, partition_id: str = "train") -> int:
        """verl's re-issue of the groups in flight at the checkpoint, counted first (async trainers, resumed).
        verl calls it as training begins, the step already moved past the checkpoint's (0 on a fresh run)."""
        checkpoint_step = self.global_steps - 1
        if self.base_mode != "sync" and checkpoint_step:
            listing = (tq.kv_list(partition_id) or {}).get(partition_id, {})
            self._resume_metrics = {"training/resume/from_step": checkpoint_step, **in_flight_at_checkpoint(listing)}
        return super()._reissue_inflight_prompts(partition_id)

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        """verl's metrics of the step; the first after an async resume also says what was in flight."""
        super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)
        metrics.update(self._resume_metrics)
        self._resume_metrics = {}

    def on_train_begin(self):
        """verl's start of training; the trainer then saves a checkpoint only after the step's metrics are
        logged (`_LogThenCheckpoint`)."""
        super().on_train_begin()
        self.logger = _LogThenCheckpoint(self.logger, self)
        self._checkpoint_deferred = True

    def _save_checkpoint(self):
        if self._checkpoint_deferred:
            self._checkpoint_due = True
        else:  # no log to follow yet
            super()._save_checkpoint()

    def _save_deferred_checkpoint(self):
        if self._checkpoint_due:
            self._checkpoint_due = False
            super()._save_checkpoint()
