"""The one epoch loop (iasgd.executors.epochs) on a scripted executor: the
order of starts, records and checkpoints for every way an epoch can end."""

from __future__ import annotations

import pytest

from iasgd.config import TrainConfig
from iasgd.executors.epochs import TrainingClock, checkpoint_due, run_epochs
from iasgd.results import Hooks, RunResult, Snapshot, Status


class Scripted:
    """An executor whose epochs end as `endings` says (one status each)."""

    def __init__(self, epochs: int, endings: dict[int, str], resumable: bool = True):
        self.cfg = TrainConfig(epochs=epochs)
        self.result = RunResult(status=Status.COMPLETED)
        self.epoch = 1
        self.endings, self.resumable = endings, resumable
        self.log: list[str] = []

    def epoch_samples(self) -> int:
        return 10

    def train_epoch(self, hooks: Hooks) -> int:
        self.log.append(f"train {self.epoch}")
        status = self.endings.get(self.epoch)
        if status is not None:
            self.result.status = status
        return 5

    def record_epoch(self, hooks: Hooks, applied: int) -> None:
        self.log.append(f"record {self.epoch}")
        hooks.on_epoch_end(None)  # type: ignore[arg-type]

    def next_epoch(self) -> None:
        self.epoch += 1

    def finish(self) -> None:
        self.log.append("finish")

    def snapshot(self) -> Snapshot | None:
        return Snapshot({}, {"epoch": self.epoch}) if self.resumable else None


def run(ex: Scripted, checkpoint_every: int = 0) -> list[str]:
    hooks = Hooks(on_epoch_start=lambda epoch, n: ex.log.append(f"start {epoch}"),
                  on_checkpoint=lambda snap: ex.log.append(f"save {snap.meta['epoch']}"))
    run_epochs(ex, hooks, checkpoint_every)
    return ex.log


def test_a_completed_run_records_every_epoch_and_saves_after_the_last() -> None:
    assert run(Scripted(2, {})) == ["start 1", "train 1", "record 1", "start 2", "train 2",
                                    "record 2", "finish", "save 3", "finish"]


def test_checkpoint_every_saves_between_epochs() -> None:
    log = run(Scripted(4, {}), checkpoint_every=2)
    assert [line for line in log if line.startswith("save")] == ["save 3", "save 5"]


def test_a_stop_saves_mid_epoch_and_records_nothing() -> None:
    ex = Scripted(3, {2: Status.INTERRUPTED})
    assert run(ex) == ["start 1", "train 1", "record 1", "start 2", "train 2", "finish",
                       "save 2"]
    assert ex.result.status == Status.INTERRUPTED


def test_the_time_budget_saves_before_recording_the_cut_epoch() -> None:
    ex = Scripted(3, {2: Status.TIME_BUDGET})
    assert run(ex)[-5:] == ["train 2", "finish", "save 2", "record 2", "finish"]


def test_a_diverged_epoch_is_recorded_and_ends_the_run_unsaved() -> None:
    assert run(Scripted(3, {1: Status.DIVERGED})) == ["start 1", "train 1", "record 1",
                                                      "finish"]


def test_an_executor_without_snapshots_is_never_saved() -> None:
    log = run(Scripted(2, {2: Status.TIME_BUDGET}, resumable=False), checkpoint_every=1)
    assert not [line for line in log if line.startswith("save")]


@pytest.mark.parametrize(("next_epoch", "epochs", "every", "due"), [
    (2, 3, 0, False), (4, 3, 0, True), (3, 5, 2, True), (4, 5, 2, False), (2, 5, 1, True)])
def test_checkpoint_due(next_epoch: int, epochs: int, every: int, due: bool) -> None:
    assert checkpoint_due(next_epoch, epochs, every) == due


def test_the_training_clock_leaves_out_what_it_is_told() -> None:
    clock = TrainingClock(already_s=100.0)
    assert clock.elapsed() >= 100.0
    before = clock.elapsed()
    clock.exclude(50.0)
    assert clock.elapsed() < before - 49.0
