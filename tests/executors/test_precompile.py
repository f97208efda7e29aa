"""Tests for iasgd.executors.precompile: which kernels a run compiles, the
children that compile them side by side, and the rule that keeps numba's
cache safe for them (every cached function reached from one job only)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import types
from pathlib import Path

import numba
import pytest

from iasgd import compiled
from iasgd.algorithms import ALGORITHMS
from iasgd.executors import precompile as P
from iasgd.nn import models, ops
from iasgd.nn import network as K
from iasgd.nn.conv import direct
from iasgd.nn.layers import conv as C
from iasgd.nn.layers import pool
from iasgd.nn.plan import nothing
from iasgd.protocol import workers as W

REPO = Path(__file__).resolve().parents[2]
JIT = not numba.config.DISABLE_JIT


def plan_of(name: str):
    model = models.build(name, "cifar10")
    return models.lower(model.arch, model.layout, 1).table


def index(folder: Path, dispatcher) -> None:
    """What numba's cache writes for `dispatcher`, as far as `uncached` looks."""
    (folder / compiled.cache_index_name(dispatcher)).touch()


def test_uncached_kernels_reads_numba_index_files(tmp_path):
    """numba's index of each entry point, found in any subdirectory (numba keeps
    each source directory in one); an index of another Python does not count."""
    assert P.uncached_kernels("sequential", cache_dir=str(tmp_path / "none")) == [
        "network.train_steps", "network.predict_images"]
    sub = tmp_path / "nn_1234abcd"
    sub.mkdir()
    index(sub, K.train_steps)
    (sub / compiled.cache_index_name(K.predict_images).replace(".py3", ".py2")).touch()
    assert P.uncached_kernels("sequential", cache_dir=str(tmp_path)) == [
        "network.predict_images"]
    index(sub, K.predict_images)
    assert P.uncached_kernels("sequential", cache_dir=str(tmp_path)) == []
    assert P.uncached_kernels("hogwild", cache_dir=str(tmp_path)) == ["workers.async_worker"]
    index(sub, W.async_worker)
    assert P.uncached_kernels("interval", cache_dir=str(tmp_path)) == []
    assert P.uncached_kernels("sync", cache_dir=str(tmp_path)) == ["workers.sync_worker"]
    assert P.uncached_kernels("sync", simulate=True, cache_dir=str(tmp_path)) == [
        "workers.read_step", "workers.compute_step", "workers.apply_step"]
    # the layer ops a model uses: LeNet-5's direct 5x5 convolutions, not the 3x3 ones
    plan = plan_of("lenet")
    missing = P.uncached_kernels("sequential", cache_dir=str(tmp_path), plan=plan)
    assert "conv.conv5_forward_op" in missing and "dense.dense_weights_op" in missing
    assert not [m for m in missing if "conv3" in m or "pad" in m]
    for op in ops.used(plan):
        index(sub, op)
    assert P.uncached_kernels("sequential", cache_dir=str(tmp_path), plan=plan) == []


def test_the_jobs_are_one_per_missing_op_and_two_for_the_executor(tmp_path):
    plan = plan_of("lenet")
    todo = P.jobs("sequential", plan, executor=lambda: None, cache_dir=str(tmp_path))
    op_names = [f"{op.__module__.rsplit('.', 1)[-1]}.{op.__name__}" for op in ops.used(plan)
                if op is not nothing]
    assert [j.name for j in todo] == ["steps", "evaluation", *op_names]
    # the run loads each op once its child has cached it; the executor's calls when it runs
    assert not todo[0].load_early and not todo[1].load_early and all(j.load_early for j in todo[2:])
    assert [j.seconds for j in todo[:2]] == [P.STEPS_COMPILE_S, P.EVALUATION_COMPILE_S]
    # each op's estimate is its kind's
    assert {j.name: j.seconds for j in todo}["conv.conv5_forward_op"] == C.ROW.compile_s[
        C.conv5_forward_op] == P.op_seconds(C.conv5_forward_op)
    assert {j.name: j.seconds for j in todo}["pool.pool_input_op"] == pool.ROW.compile_s[
        pool.pool_input_op]
    interval = P.jobs("interval", plan, executor=lambda: None, cache_dir=str(tmp_path))
    assert interval[0].seconds == P.STEPS_COMPILE_S + P.WORKER_LOOP_COMPILE_S
    index(tmp_path, K.train_steps)  # the steps cached, the evaluation not yet
    assert [j.name for j in P.jobs("sequential", plan, lambda: None, str(tmp_path))] == [
        "evaluation", *op_names]
    # no executor (the simulator compiles its own calls): the ops only
    assert [j.name for j in P.jobs("interval", plan, None, str(tmp_path))] == op_names
    for d in P.kernel_entries("sequential"):
        index(tmp_path, d)
    assert [j.name for j in P.jobs("sequential", plan, lambda: None, str(tmp_path))] == op_names
    for op in ops.used(plan):
        index(tmp_path, op)
    assert P.jobs("sequential", plan, lambda: None, str(tmp_path)) == []


def job(name: str, seconds: float) -> P.Job:
    return P.Job(name, seconds, lambda: None)


def test_shares_put_the_longest_job_first_on_the_least_loaded_child():
    todo = [job("a", 1), job("b", 5), job("c", 2), job("d", 2), job("e", 3)]
    assert [[j.name for j in s] for s in P.shares(todo, 2)] == [["b", "d"], ["e", "c", "a"]]
    assert [[j.name for j in s] for s in P.shares(todo, 9)] == [["b"], ["e"], ["c"], ["d"],
                                                                 ["a"]]
    assert [[j.name for j in s] for s in P.shares(todo, 0)] == [["b", "e", "c", "d", "a"]]
    assert P.compile_seconds(todo, 2) == 7 + P.LOAD_S  # the longest share, then loading it
    assert P.compile_seconds(todo, 0) == 13  # in-process: nothing to load
    assert P.compile_seconds([], 2) == 0


def test_children_compile_only_where_it_pays_and_processes_fork(monkeypatch):
    todo = [job(str(i), 1) for i in range(12)]
    if sys.platform.startswith("linux"):
        assert P.children(todo, 16) == P.MAX_CHILDREN
        assert P.children(todo[:3], 16) == 3
        assert P.children(todo, 2) == 2
    assert P.children(todo, 1) == 0
    assert P.children(todo[:1], 16) == 0
    monkeypatch.setattr(sys, "platform", "darwin")
    assert P.children(todo, 16) == 0


def test_the_estimate_counts_the_children_and_the_simulators_own_compiling(monkeypatch,
                                                                          tmp_path):
    plan = plan_of("lenet")
    real = P._uncached
    monkeypatch.setattr(P, "_uncached", lambda algo, sim, _, plan: real(algo, sim,
                                                                           str(tmp_path), plan))
    todo = P.jobs("sequential", plan, lambda: None, str(tmp_path))
    assert P.compile_estimate("sequential", plan, 1) == round(sum(j.seconds for j in todo))
    if sys.platform.startswith("linux"):
        assert P.compile_estimate("sequential", plan, 2) == round(P.compile_seconds(todo, 2))
    for d in P.kernel_entries("sequential", plan=plan):
        index(tmp_path, d)
    assert P.compile_estimate("sequential", plan, 2) == 0
    ops_only = P.jobs("interval", plan, None, str(tmp_path))
    assert P.compile_estimate("interval", plan, 1, simulate=True) == round(
        sum(j.seconds for j in ops_only) + P.STEPS_COMPILE_S + P.EVALUATION_COMPILE_S
        + P.WORKER_LOOP_COMPILE_S)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="children fork on Linux only")
def test_every_job_runs_in_a_child_and_one_that_fails_stops_no_other(tmp_path):
    def writes(name: str):
        return lambda: (tmp_path / name).write_text(str(os.getpid()))

    def fails():
        raise ValueError("a failing compile")

    reported = []

    def finished(job: P.Job) -> None:
        reported.append((job.name, os.getpid()))

    todo = [P.Job("a", 3, writes("a")), P.Job("bad", 2, fails), P.Job("b", 1, writes("b")),
            P.Job("c", 1, writes("c"))]
    codes = P.run_in_children(todo, 2, finished)
    assert sorted(codes) == [0, 1]  # the child that took the failing job says so
    pids = {name: int((tmp_path / name).read_text()) for name in "abc"}
    assert os.getpid() not in pids.values()
    # the run hears of each job that ran, in its own process, and of no other
    assert sorted(reported) == [(name, os.getpid()) for name in "abc"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="children fork on Linux only")
def test_a_child_takes_the_next_job_when_it_is_free_not_a_share_fixed_ahead(tmp_path):
    """Estimates are rough: "slow" is estimated 3 but cannot end before "e"
    (estimated 1) has run. Split ahead by the estimates, e would wait in
    slow's child behind it (shares: [slow, d, e], [b, c]), and slow would
    time out; taken one at a time, the other child runs b, c, d and e."""
    def slow():
        for _ in range(3000):  # 30 s at most
            if (tmp_path / "e").exists():
                (tmp_path / "slow").write_text(str(os.getpid()))
                return
            time.sleep(0.01)
        raise TimeoutError("e never ran beside slow")

    def writes(name: str):
        return lambda: (tmp_path / name).write_text(str(os.getpid()))

    todo = [P.Job("slow", 3, slow), *(P.Job(n, s, writes(n)) for n, s in
                                       [("b", 2), ("c", 2), ("d", 1), ("e", 1)])]
    assert [[j.name for j in share] for share in P.shares(todo, 2)] == [["slow", "d", "e"],
                                                                        ["b", "c"]]
    assert P.run_in_children(todo, 2) == [0, 0]
    pids = {name: int((tmp_path / name).read_text()) for name in ["slow", *"bcde"]}
    assert len({pids[n] for n in "bcde"}) == 1 and pids["slow"] != pids["e"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="children fork on Linux only")
def test_the_run_starts_before_a_deferred_job_is_done(tmp_path):
    """The evaluation is compiled while the run trains: a deferred job is
    taken last, and the run goes on once every other job is done. Here the
    deferred job cannot end before the run has gone on (it waits for a file
    written after that): were the run to wait for it, the job would time
    out and fail."""
    def deferred():
        for _ in range(3000):  # 30 s at most
            if (tmp_path / "started").exists():
                (tmp_path / "evaluation").write_text("done")
                return
            time.sleep(0.01)
        raise TimeoutError("the run waited for the deferred job")

    reported = []
    todo = [P.Job("evaluation", 9, deferred, deferred=True),
            *(P.Job(n, 1, lambda: None) for n in "abc")]
    children = P.Children(todo, 2, lambda job: reported.append(job.name))
    assert [job.name for job in children.order] == ["a", "b", "c", "evaluation"]
    children.report(until_deferred=True)
    assert sorted(reported) == ["a", "b", "c"] and children.pipes
    (tmp_path / "started").touch()
    children.report(until_deferred=False)
    assert children.join() == [0, 0]
    assert reported[-1] == "evaluation" and (tmp_path / "evaluation").exists()


def test_the_estimate_leaves_deferred_jobs_out_where_children_compile():
    todo = [P.Job("a", 2, lambda: None), P.Job("b", 1, lambda: None),
            P.Job("evaluation", 5, lambda: None, deferred=True)]
    assert P.compile_seconds(todo, 2) == pytest.approx(2 + P.LOAD_S)
    assert P.compile_seconds(todo, 0) == pytest.approx(8)  # in-process: one after another


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="children fork on Linux only")
def test_a_child_leaves_ctrl_c_to_the_run(tmp_path):
    """Ctrl-C reaches every process of the group; iasgd.run's handler (which
    a child would inherit) only prints and asks for a stop at the next step.
    A child ignores it and finishes its share."""
    import signal

    def interrupted_then_writes():
        os.kill(os.getpid(), signal.SIGINT)
        (tmp_path / "done").write_text("yes")

    previous = signal.signal(signal.SIGINT, lambda *_: (tmp_path / "handled").touch())
    try:
        codes = P.run_in_children([P.Job("a", 1, interrupted_then_writes),
                                   P.Job("b", 1, lambda: None)], 2)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert codes == [0, 0]
    assert (tmp_path / "done").read_text() == "yes" and not (tmp_path / "handled").exists()


def test_stand_in_tables_have_the_real_type_and_run_nothing():
    plan = plan_of("lenet")
    real = ops.network(plan, 1)
    with ops.stand_ins():
        stand_in = ops.network(plan, 1)
    assert ops.network(plan, 1).ops == real.ops  # the switch is off again
    assert numba.typeof(stand_in) == numba.typeof(real)
    idle = ops.compiled_op(nothing)
    assert all(entry is idle for entry in stand_in.ops)
    assert not all(entry is idle for entry in real.ops)


def _callees(func, found: set) -> set:
    """The compiled functions `func` calls, directly or through them: the
    global names its code reads, and names read as attributes of a module
    it reads (K.network_loss_and_grad)."""
    code = getattr(func, "py_func", func).__code__
    space = getattr(func, "py_func", func).__globals__
    names = set(code.co_names)
    for const in code.co_consts:  # nested functions and comprehensions
        if isinstance(const, types.CodeType):
            names |= set(const.co_names)
    seen = [space.get(n) for n in names]
    seen += [getattr(m, n, None) for m in seen if isinstance(m, types.ModuleType) for n in names]
    for obj in seen:
        if isinstance(obj, numba.core.registry.CPUDispatcher) and obj not in found:
            found.add(obj)
            _callees(obj, found)
    return found


def _cached(dispatcher) -> bool:
    return dispatcher.targetoptions.get("inline", "never") != "always"


@pytest.mark.skipif(not JIT, reason="nothing is compiled without the jit")
def test_no_cached_function_is_reached_from_two_jobs():
    """Children write numba's cache side by side; two of them adding entries
    of one function could give both the same data file. So each cached
    function is reached from one job only: one layer op, the executor's
    steps (every algorithm's, the simulator's included), or the evaluation."""
    jobs = {op.__name__: _callees(op, set()) for op in ops.OPS}
    jobs["steps"] = set().union(*(_callees(e, {e}) for algo in ALGORITHMS for simulate in
                                  (False, True) for e in P.kernel_entries(algo, simulate)
                                  if e is not K.predict_images))
    jobs["evaluation"] = _callees(K.predict_images, {K.predict_images})
    assert _callees(K.train_steps, set()) >= {K.network_loss_and_grad, K.network_forward}
    assert W.compute_step in jobs["steps"] and direct.conv5_forward in jobs["conv5_forward_op"]
    owner: dict = {}
    for name, reached in jobs.items():
        for d in filter(_cached, reached):
            assert owner.setdefault(d, name) == name, (
                f"{d.py_func.__name__} is reached from {owner[d]} and {name}: inline it "
                "(iasgd.compiled.jit_inline)")


BUILDS_ONLY = r"""
import iasgd
from numba.core import event
from iasgd import engine
from iasgd.nn import network as K, ops
from iasgd.nn.plan import nothing
model, data = iasgd.build("lenet", "synthetic"), iasgd.load("synthetic")
ops.compiled_op(nothing)
for algo, threads in [("sequential", 1), ("sync", 2), ("async", 2), ("interval", 2)]:
    cfg = iasgd.TrainConfig(algo=algo, threads=threads, epochs=1)
    with event.install_recorder("numba:compile") as compiles, ops.stand_ins():
        engine._runner(cfg)(model, data, cfg, None, None)
    print(algo, sum(e.is_start for _, e in compiles.buffer))
"""


@pytest.mark.skipif(not JIT, reason="compiles with the jit")
def test_building_an_executor_compiles_nothing(tmp_path):
    """The steps' and the evaluation's children each build the executor: if
    building it compiled a cached function, both would write its entries."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "NUMBA_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", BUILDS_ONLY], capture_output=True, text=True,
                         env=env, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["sequential", "0", "sync", "0", "async", "0", "interval", "0"]


CHECK_LOADED = r"""
import iasgd, sys
from iasgd.executors import precompile
from iasgd.executors.sequential import SequentialRun
from iasgd.nn import network as K, ops
from iasgd.nn.plan import nothing
model, data = iasgd.build("mlp", "synthetic"), iasgd.load("synthetic")
cfg = iasgd.TrainConfig(algo="sequential", epochs=1, batch_size=8, eval_every=0)
steps = []  # stopped at its first progress report: it never evaluates
hooks = iasgd.Hooks(on_progress=lambda done, live: steps.append(done),
                    should_stop=lambda: "interrupted" if steps else None)
result = iasgd.train(model, data, cfg, hooks)
assert steps and result.status == "interrupted" and not result.epochs, result.status
assert not K.predict_images.stats.cache_hits and not K.predict_images.stats.cache_misses
early = sorted(op.__name__ for op, _ in ops._COMPILED if op is not nothing)  # loaded as they came
precompile.load_kernels(SequentialRun(model, data, cfg))  # the evaluation too: its child cached it
compiled = [d.py_func.__name__ for d in (K.train_steps, K.predict_images)
            if d.stats.cache_misses or not d.stats.cache_hits]
compiled += [op.__name__ for (op, _), f in ops._COMPILED.items()
             if op is not nothing and not f.cache_hits]
plan = iasgd.nn.models.lower(model.arch, model.layout, 1).table
assert early == sorted(op.__name__ for op in ops.used(plan) if op is not nothing), early
print(precompile.deferred(), compiled)
"""


@pytest.mark.skipif(not (JIT and sys.platform.startswith("linux")),
                    reason="children compile with the jit, on Linux")
def test_after_the_children_the_run_loads_everything_from_the_cache(tmp_path):
    """The contract, in a fresh process with an empty cache (an MLP: ~5-10 s):
    what the children compile is what the run then finds, so it compiles
    nothing itself; the evaluation, compiled while the run trains, is in the
    cache when the run ends, even one stopped before it evaluated."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "NUMBA_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", CHECK_LOADED], capture_output=True, text=True,
                         env=env, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[-2] == "False []"


@pytest.mark.parametrize("cold", [True, False])
def test_a_cold_start_prunes_the_old_caches(cold, monkeypatch):
    """compile_ahead deletes old code's caches (compiled.prune_caches) when
    it has something to compile, and only then."""
    pruned = []
    monkeypatch.setattr(compiled, "prune_caches", lambda: pruned.append(True))
    todo = [P.Job("steps", 1.0, lambda: None)] if cold else []
    monkeypatch.setattr(P, "jobs", lambda algo, plan, executor: todo)
    assert P.compile_ahead(models.build("lenet", "cifar10"), "sequential", None, cores=1) == 0
    assert pruned == [True] * cold
