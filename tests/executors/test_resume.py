"""What a resume of a parallel run restores: a one-thread threaded run
resumed mid-epoch or after its last epoch ends bit-identical to the run
never stopped; with many threads (and the parameter server of a Ray run)
every array, counter and schedule state a snapshot holds is what the
resumed executor starts from.

A resume reseeds the workers' random streams (iasgd.protocol.workers.
stream_seed, with the segment: how often the run was resumed), so a resumed
run draws other batches than the run never stopped, even on one thread. The
run it is compared with reseeds its streams the same way at the same
update, from a hook, while its worker waits for its next allowance; all
else (parameters, momentum, gate, counters, schedules, losses) it carries
on, so any state the resume fails to restore shows in the parameters.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

from iasgd import data as datasets
from iasgd import engine
from iasgd.executors import cluster as C
from iasgd.executors import simulated as sim
from iasgd.executors import threads
from iasgd.nn import models
from iasgd.protocol import gate as G
from iasgd.results import Snapshot, result_meta

N_TRAIN, BATCH = 400, 4  # 100 updates per epoch
QUOTA = N_TRAIN // BATCH


@pytest.fixture(scope="module")
def tiny():
    data = datasets.synthetic(seed=1, n_train=N_TRAIN, n_test=50, shape=(1, 4, 4), num_classes=2)
    model = models.build("mlp", input_shape=(1, 4, 4), num_classes=2, hidden=(4,))
    return model, data


def kept(snap: Snapshot) -> Snapshot:
    """A copy of a snapshot (a threaded run's holds its live arrays)."""
    return Snapshot({k: np.array(v, copy=True) for k, v in snap.arrays.items()},
                    copy.deepcopy(snap.meta))


class AtUpdate:
    """Hooks that act once when `at` updates are written (G.DONE): at an
    eval_every boundary inside an epoch, where the main thread always looks
    (should_stop) while every worker waits for the next allowance, or at the
    end of an epoch (on_epoch_end). stop: ask the run to stop there (it
    saves its checkpoint; at an epoch's end the hook cannot stop the run);
    otherwise reseed the streams as the resume will."""

    def __init__(self, run: threads.ThreadedRun, at: int, stop: bool):
        self.run, self.at, self.stop = run, at, stop
        self.acted = False
        self.snapshots: list[Snapshot] = []

    def hooks(self) -> engine.Hooks:
        return engine.Hooks(should_stop=self.should_stop, on_epoch_end=self.epoch_end,
                            on_checkpoint=lambda snap: self.snapshots.append(kept(snap)))

    def _here(self) -> bool:
        return not self.acted and int(self.run.team.state[G.DONE]) == self.at

    def should_stop(self) -> str | None:
        if self.at % QUOTA and self._here():
            return self._act()
        return None

    def epoch_end(self, record) -> None:
        if self.at % QUOTA == 0 and self._here():
            self._act()

    def _act(self) -> str | None:
        self.acted = True
        if self.stop:
            return "interrupted"
        self.run.team.seed_streams(self.run.cfg.seed, self.run.segment + 1)
        return None


def config(algo: str, **kw) -> engine.TrainConfig:
    base = {"threads": 1, "epochs": 3, "batch_size": BATCH, "lr": 0.05, "momentum": 0.9,
            "seed": 7, "eval_every": 30}
    if algo == "interval" and "interval_schedule" not in kw:
        base["interval"] = 3
    return engine.TrainConfig(algo=algo, **{**base, **kw})


@pytest.mark.parametrize("algo", ["hogwild", "interval"])
@pytest.mark.parametrize("at", [150, 2 * QUOTA])  # inside epoch 2; after epoch 2
def test_a_one_thread_resume_is_bit_identical_to_the_run_never_stopped(tiny, algo, at):
    """One worker thread, momentum 0.9: stopped (mid-epoch, at an eval_every
    boundary) or ended (after its last epoch, then extended) and resumed, it
    ends with the very bits of the run never stopped, given the same
    batches (module doc). One worker is deterministic: its staleness is
    always 0 and its batches come from its own stream."""
    model, data = tiny
    cfg = config(algo)
    whole_run = threads.ThreadedRun(model, data, cfg)
    reseed = AtUpdate(whole_run, at, stop=False)
    whole = whole_run.run(reseed.hooks())
    assert reseed.acted and whole.status == "completed"

    first_cfg = cfg if at % QUOTA else dataclasses.replace(cfg, epochs=at // QUOTA)
    first_run = threads.ThreadedRun(model, data, first_cfg)
    stopper = AtUpdate(first_run, at, stop=True)  # after epoch 2 the run ends anyway
    first = first_run.run(stopper.hooks())
    assert first.status == ("interrupted" if at % QUOTA else "completed")
    [snap] = stopper.snapshots
    assert int(snap.arrays["state"][G.DONE]) == at and np.any(snap.arrays["velocity"] != 0)

    resumed = engine.train(model, data, cfg, resume=snap)
    assert resumed.status == "completed" and resumed.applied == whole.applied == 3 * QUOTA
    assert resumed.params.tobytes() == whole.params.tobytes()
    assert [e.train_loss for e in resumed.epochs] == [e.train_loss for e in whole.epochs]
    assert [e.test_accuracy for e in resumed.epochs] == [e.test_accuracy for e in whole.epochs]
    assert [e[1:] for e in resumed.evals] == [e[1:] for e in whole.evals]
    assert resumed.staleness_hist.tolist() == whole.staleness_hist.tolist()
    assert resumed.intervals == whole.intervals
    assert resumed.bound_violations == whole.bound_violations == 0


# ----------------------------------------- many threads: what is restored

# the state slots a resume clears: the stop that ended the last segment, its
# deadline, and sync's barrier count (a stop leaves it between rounds)
CLEARED = [G.STOP, G.EXPIRED, G.DEADLINE, G.ABORT, G.BARRIER_COUNT]


@pytest.mark.parametrize(("algo", "extra"), [
    ("hogwild", {"threads_schedule": "window", "window": 2, "probe_steps": 20,
                 "exec_steps": 60, "lr_schedule": "tail"}),
    ("interval", {"interval_schedule": "probe", "y0": 8, "probe_steps": 20, "exec_steps": 60}),
    ("interval", {"gate": "drop"}),
    ("sync", {}),
])
def test_a_threaded_resume_starts_from_every_array_the_snapshot_holds(tiny, algo, extra):
    """4 threads stopped inside epoch 2: the resumed executor's parameters,
    momentum, gate state, counters, histograms, loss ring, step-size
    factors, schedules and result are the snapshot's, bit for bit (the
    gate's stop cleared); and it completes the run from there."""
    model, data = tiny
    cfg = config(algo, threads=4, **extra)
    run = threads.ThreadedRun(model, data, cfg)
    stopper = AtUpdate(run, 150, stop=True)
    assert run.run(stopper.hooks()).status == "interrupted"
    [snap] = stopper.snapshots
    saved = snap.arrays
    assert np.any(saved["velocity"] != 0) and int(saved["state"][G.DONE]) == 150

    again = threads.ThreadedRun(model, data, cfg, resume=kept(snap))
    team = again.team
    for name in threads.ThreadedRun.TEAM_ARRAYS:
        mine, theirs = getattr(team, name), saved[name]
        if name == "state":
            mine, theirs = np.delete(mine, CLEARED), np.delete(theirs, CLEARED)
            assert not team.state[CLEARED].any()
        elif name == "senses":  # every worker's barrier sense is the barrier's
            theirs = np.full_like(theirs, saved["state"][G.BARRIER_SENSE])
        assert mine.dtype == theirs.dtype and mine.tobytes() == theirs.tobytes(), name
    assert again.control.state() == snap.meta["control"]
    assert (again.epoch, again.epoch_time, again.segment) == (
        snap.meta["epoch"], snap.meta["epoch_time"], snap.meta["segment"] + 1)
    restored = result_meta(again.result)
    assert restored.pop("status") == "completed"
    assert restored == {k: v for k, v in snap.meta["result"].items() if k != "status"}
    assert again.result.params is team.params

    resumed = again.run(engine.Hooks())
    assert resumed.status == "completed"
    assert resumed.applied == 3 * QUOTA == resumed.staleness_hist.sum()
    assert resumed.computed >= snap.meta["result"]["computed"]
    assert resumed.bound_violations == 0


def test_a_simulated_run_hands_no_checkpoint(tiny):
    """The simulator has nothing to restore: its runs are not checkpointed
    (SimulatedRun.snapshot is None), even when a stop or the end of the run
    would save one. A simulator that starts handing out snapshots needs a
    resume, and tests of what it restores, like the ones above."""
    model, data = tiny
    saved = []
    cfg = config("interval", threads=4, epochs=2, eval_every=0)
    result = sim.simulate(model, data, cfg, sim.lognormal_steps(1e-3, 0.2), cores=2,
                          hooks=engine.Hooks(on_checkpoint=saved.append))
    assert result.status == "completed" and result.applied == 2 * QUOTA
    assert saved == [] and result.bound_violations == 0


# -------------------------- the parameter server of a Ray run, without Ray


def test_a_restored_parameter_server_continues_from_its_snapshot():
    """What a Ray run's resume restores at the cluster level (RayRun._restore
    hands the snapshot's server arrays and figures to ParameterServer.restore;
    its nodes start afresh, their momentum from zero, by design): the
    parameters, staleness histogram, versions, intervals and y, the updates
    applied, and every count, the violations included; no ticket leased, no
    slot held, the stop over."""
    P, y = 16, 2
    # the drop policy: no pull waits for a slot, so one thread can drive both nodes
    cfg = engine.TrainConfig(algo="interval", threads=1, backend="ray", nodes=2,
                             node_interval=y, node_gate="drop", sync_every=2)
    server = C.ParameterServer(np.zeros(P, np.float32), cfg)
    server.allow(100)
    rng = np.random.default_rng(0)
    pulls = {node: server.exchange(C.Push(node, None, 0, 0, -1), 2) for node in (0, 1)}
    for step in range(5):
        node = step % 2
        r = pulls[node]
        v_base = r.version - y if step == 3 else r.version  # one planted violation
        pulls[node] = server.exchange(C.Push(node, rng.standard_normal(P).astype(np.float32),
                                             r.granted, v_base, r.gen, computed=r.granted), 2)
    server.node_lost(1, "killed")
    server.stop()
    arrays, meta = server.snapshot()
    assert meta["violations"] == 1 and meta["dropped_pushes"] > 0
    assert meta["pushes"] + meta["dropped_pushes"] == 5 and meta["lost"]

    fresh = C.ParameterServer(np.zeros(P, np.float32), cfg)
    fresh.restore(copy.deepcopy(arrays), copy.deepcopy(meta))
    assert fresh.params.tobytes() == arrays["params"].tobytes()
    assert fresh.node_hist.tolist() == arrays["node_hist"].tolist()
    old, s = arrays["server_state"], fresh.state
    for slot in (G.VERSION, G.INTERVALS, G.Y_MAX, G.Y, G.Y_NEXT, G.DONE):
        assert s[slot] == old[slot], slot
    assert s[G.TICKETS] == s[G.LIMIT] == old[G.DONE] and not s[G.STOP]
    again_arrays, again_meta = fresh.snapshot()
    assert again_meta == meta
    assert all(again_arrays[k].tobytes() == arrays[k].tobytes() for k in ("params", "node_hist"))
    assert fresh.summary()["node_staleness"]["violations"] == 1
    assert fresh.leased == {0: 0, 1: 0} and fresh.slot == {0: -1, 1: -1}
