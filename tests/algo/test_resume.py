"""A resumed run's files follow its checkpoint: metrics kept and appended, later records removed, and a
checkpoint saved only after its step is logged, and what an async run had in flight counted."""

from __future__ import annotations

import json

from omegaconf import OmegaConf
from verl.utils.tracking import Tracking

from verl_memagent.algo.resume import (
    ResumeMixin,
    appending_file_logger,
    in_flight_at_checkpoint,
    keep_metrics_until,
    metrics_file,
    remove_records_after,
)


def _lines(path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_metrics_of_later_steps_are_dropped_and_verls_logger_appends(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": step, "data": {"x": step}}) + "\n" for step in (1, 2, 3)))
    assert keep_metrics_until(path, 2) == 2
    assert _lines(path) == [1, 2]

    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    with appending_file_logger():
        tracker = Tracking(project_name="p", experiment_name="e", default_backend=["file"])
    tracker.log(data={"x": 3.0}, step=3)
    tracker.logger["file"].finish()
    assert _lines(path) == [1, 2, 3]
    # outside the block verl's own logger starts the file afresh, as it always did
    Tracking(project_name="p", experiment_name="e", default_backend=["file"]).logger["file"].finish()
    assert path.read_text() == ""
    assert keep_metrics_until(tmp_path / "absent.jsonl", 2) == 0


def test_the_metrics_file_is_verls(tmp_path, monkeypatch):
    config = OmegaConf.create({"trainer": {"logger": ["console", "file"], "project_name": "p", "experiment_name": "e"}})
    monkeypatch.delenv("VERL_FILE_LOGGER_PATH", raising=False)
    monkeypatch.setenv("VERL_FILE_LOGGER_ROOT", str(tmp_path))
    assert metrics_file(config) == tmp_path / "p" / "e.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "m.jsonl"))
    assert metrics_file(config) == tmp_path / "m.jsonl"
    config.trainer.logger = "console"
    assert metrics_file(config) is None


def test_records_of_steps_after_the_checkpoint_are_removed(tmp_path):
    names = ["step_1.jsonl", "step_2.jsonl", "step_3.jsonl", "validation_step_0.jsonl", "validation_step_3.jsonl"]
    for name in [*names, "eval.jsonl"]:
        (tmp_path / name).write_text("")
    removed = remove_records_after(tmp_path, 2)
    assert sorted(path.name for path in removed) == ["step_3.jsonl", "validation_step_3.jsonl"]
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "eval.jsonl",
        "step_1.jsonl",
        "step_2.jsonl",
        "validation_step_0.jsonl",
    ]


class _Trainer:
    """verl's trainer as far as the mixin sees it: its save and its hooks, recording their order."""

    def __init__(self):
        self.events: list[str] = []
        self.global_steps = 1

    def _save_checkpoint(self):
        self.events.append(f"save {self.global_steps}")

    def on_train_begin(self):
        self.logger = self

    def log(self, data, step):
        self.events.append(f"log {step}")


class _Resuming(ResumeMixin, _Trainer):
    base_mode = "sync"


class _ResumingAsync(ResumeMixin, _Trainer):
    base_mode = "colocate_async"


def test_a_checkpoint_is_saved_after_its_step_is_logged():
    for trainer in (_Resuming(), _ResumingAsync()):
        trainer._save_checkpoint()  # before training begins no log follows: saved at once
        assert trainer.events == ["save 1"]
        trainer.events.clear()
        trainer.on_train_begin()
        # verl's step: the save it asks for comes before validation and the log
        trainer._save_checkpoint()
        trainer.logger.log(data={}, step=1)
        trainer.global_steps = 2
        trainer.logger.log(data={}, step=2)  # a step without a checkpoint saves nothing
        assert trainer.events == ["log 1", "save 1", "log 2"], trainer.base_mode


def test_what_was_in_flight_at_the_checkpoint_is_counted():
    """A TransferQueue listing as `tq.kv_list` gives it: group a finished, b running with two of its trajectories
    done (one of them two rows), c pending with none, d failed."""
    listing = {
        "a": {"is_prompt": True, "status": "finished", "global_steps": 1},
        "a_0_0": {"status": "success"},
        "a_1_0": {"status": "success"},
        "b": {"is_prompt": True, "status": "running", "global_steps": 2},
        "b_0_0": {"status": "success"},
        "b_0_1": {"status": "success"},
        "b_3_0": {"status": "success"},
        "c": {"is_prompt": True, "status": "pending", "global_steps": 2},
        "d": {"is_prompt": True, "status": "failure", "global_steps": 1},
    }
    assert in_flight_at_checkpoint(listing) == {
        "training/resume/restored_groups": 2,
        "training/resume/reissued_groups": 2,
        "training/resume/discarded_trajectories": 2,
    }
    assert in_flight_at_checkpoint({}) == dict.fromkeys(in_flight_at_checkpoint(listing), 0)
