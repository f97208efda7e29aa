"""The epoch loop every executor runs: what happens around an epoch (its
start, a stop, the time budget, the record, the checkpoints) is written
here once; an executor says only how an epoch is trained, recorded and
saved.

    while epochs are left:
        on_epoch_start
        train_epoch                  until the quota is applied or the run stops
        stopped (Ctrl-C, ...)        -> checkpoint (resumes mid-epoch), return
        cut by the time budget       -> checkpoint (a resume ends the cut epoch)
        record_epoch                 evaluate, append the record, on_epoch_end
        diverged or out of time      -> return
        next_epoch; checkpoint every `checkpoint_every` epochs and after the last

Inside an epoch, `--eval-every N` cuts the updates into chunks that end at
each multiple of N (applied since the start of the run): `train_in_chunks`
runs them and evaluates at each boundary reached, for every executor.
What an executor does inside this loop that every executor does alike is
iasgd.executors.base.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from iasgd.config import TrainConfig, eval_points
from iasgd.results import Hooks, RunResult, Snapshot, Status

# How a run may end an epoch and still record it; any other status is a stop.
RECORDED_ENDS = (Status.COMPLETED, Status.TIME_BUDGET, Status.DIVERGED)


class Executor(Protocol):
    cfg: TrainConfig
    result: RunResult
    epoch: int  # the epoch being trained, or next to train (1-based)

    def epoch_samples(self) -> int:
        """Samples an epoch trains on, for the progress display."""

    def train_epoch(self, hooks: Hooks) -> int:
        """Train the current epoch until its quota is applied or the run must
        stop; on a stop set result.status (and diverged_at). Returns the
        updates applied in this epoch."""

    def record_epoch(self, hooks: Hooks, applied: int) -> None:
        """Evaluate, append the epoch's record and call hooks.on_epoch_end."""

    def next_epoch(self) -> None:
        """Move on to the next epoch (epoch + 1, its clock at zero)."""

    def finish(self) -> None:
        """Bring the run-wide figures of the result up to date."""

    def snapshot(self) -> Snapshot | None:
        """What a resume needs; None: this executor's runs cannot be resumed."""


def checkpoint_due(next_epoch: int, epochs: int, every: int) -> bool:
    """A checkpoint every `every` epochs (0: none) and after the last one."""
    return next_epoch > epochs or (every > 0 and (next_epoch - 1) % every == 0)


def run_epochs(ex: Executor, hooks: Hooks, checkpoint_every: int = 0) -> RunResult:
    """Run `ex`'s remaining epochs (module doc); returns its result."""
    cfg, r = ex.cfg, ex.result
    while ex.epoch <= cfg.epochs:
        hooks.on_epoch_start(ex.epoch, ex.epoch_samples())
        applied = ex.train_epoch(hooks)
        if r.status not in RECORDED_ENDS:  # mid-epoch: a resume continues here
            _save(ex, hooks)
            return r
        if r.status == Status.TIME_BUDGET:  # before the cut epoch is recorded: a resume ends it
            _save(ex, hooks)
        ex.record_epoch(hooks, applied)
        if r.status != Status.COMPLETED:
            break
        ex.next_epoch()
        if checkpoint_due(ex.epoch, cfg.epochs, checkpoint_every):
            _save(ex, hooks)
    ex.finish()
    return r


def train_in_chunks(done: Callable[[], int], end: int, every: int,
                    run_until: Callable[[int], None], stopped: Callable[[], bool],
                    out_of_time: Callable[[], bool], evaluate: Callable[[], bool]) -> None:
    """Train to `end` updates (applied since the start of the run) in the
    chunks `eval_every` makes: run_until(limit) allows updates up to each
    boundary and returns once they are written or the run stopped. A
    boundary reached is evaluated (evaluate(); False: the parameters
    diverged) even if a stop came with it, since a resume goes on after it,
    but not when the time budget ran out there (out_of_time()): the cut
    epoch's record is that evaluation. Stops at the first of: `end`, a stop
    (stopped()), a failed evaluation."""
    for limit in eval_points(done(), end, every):
        run_until(limit)
        if limit == end:
            return
        reached = done() == limit and not out_of_time()
        if (reached and not evaluate()) or stopped():
            return


def _save(ex: Executor, hooks: Hooks) -> None:
    ex.finish()
    snapshot = ex.snapshot()
    if snapshot is not None:
        hooks.on_checkpoint(snapshot)


class TrainingClock:
    """Training seconds of the current epoch, evaluation excluded: started at
    the epoch's start (less what a resumed epoch had already trained) and
    moved on by every evaluation made inside the epoch."""

    def __init__(self, already_s: float = 0.0):
        self.start = time.perf_counter() - already_s

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def exclude(self, seconds: float) -> None:
        """Leave `seconds` (an evaluation's) out of the training time."""
        self.start += seconds
