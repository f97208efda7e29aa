"""Compile a run's kernels before it starts, side by side, in child processes.

A cold start (an empty numba cache) is numba compiling what the run calls:
each layer op its model uses (iasgd.nn.ops, one C callback each), the
sequential steps or a worker loop, and the evaluation. numba compiles one
function after another on one core. `compile_ahead` hands them to child
processes instead, as many as the run may use cores, forked once the run has
its model and data. Each child takes the next job (longest first) whenever
it is done with one and compiles it into numba's on-disk cache; the run
loads each layer op from there as soon as its job is done, and the rest
once all are, as on any later start. All but the evaluation: it is a
deferred job, taken last, and the run starts training once every other job
is done; its first evaluation waits for the child (`finish_deferred`).

- The functions the executor calls from Python form two jobs: the steps
  (or the worker loop) and the evaluation. Each one's child builds the
  executor with stand-in op tables (iasgd.nn.ops.stand_ins: the same numba
  type, no ops to wait for) and calls its `load_steps` or
  `load_evaluation`: the run's own calls with the run's own types, so what
  it caches is exactly what the run looks up.
- Each layer op the cache lacks is a job of its own.
- numba's cache takes writers side by side only if no two of them write
  entries of the same function: two new entries can pick the same file
  name. So every cached function must be reached from one job only. The
  helpers that ops share, and the forward pass that the steps share with
  the evaluation, are inlined (iasgd.compiled.jit_inline).
  tests/executors/test_precompile.py checks this, and that building an
  executor compiles nothing.

Nothing depends on it. A child that fails leaves what it did not compile
uncached, and the run compiles that itself, as it would without children.
It runs only where processes fork (Linux); elsewhere a run compiles
in-process.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from iasgd.algorithms import ALGORITHMS
from iasgd.nn import models, network, ops
from iasgd.nn.plan import nothing
from iasgd.protocol import workers

# Seconds that compiling each kind of job takes in a child on an idle 2-core
# VM (the cold runs they come from: bench/results/compile-times.md); a layer
# op's estimate is its kind's (iasgd.nn.layers, RowOp.compile_s). The steps
# job covers the network's passes; a worker loop adds the loop. Loading what
# the children cached takes about LOAD_S.
STEPS_COMPILE_S = 1.8
EVALUATION_COMPILE_S = 0.9
WORKER_LOOP_COMPILE_S = 3.0
LOAD_S = 0.5
# Each compiling process holds a few hundred MB: more than this many children
# would not shorten a cold start much (a model uses at most ~15 ops).
MAX_CHILDREN = 8


class LoadsKernels(Protocol):
    """What precompile needs of an executor (the sequential and the threads
    one; not every Executor of iasgd.executors.epochs has it)."""

    def load_steps(self) -> None:
        """Load (or compile) the steps or the worker loop."""

    def load_evaluation(self) -> None:
        """Load (or compile) what the evaluation calls."""


@dataclass(frozen=True)
class Job:
    """What one child compiles: `run()` puts it in the on-disk cache (and,
    once it is there, loads it)."""

    name: str
    seconds: float  # the estimate: the longest jobs are taken first
    run: Callable[[], Any]
    # the run calls `run()` itself as soon as a child reports the job done,
    # loading it while the rest compile (False: it loads it when it calls it)
    load_early: bool = False
    # the run starts training before it is done (the evaluation, first
    # called after some training): taken last, waited for by
    # `finish_deferred`
    deferred: bool = False


def kernel_entries(algo: str, simulate: bool = False, plan: np.ndarray | None = None) -> list:
    """The compiled functions a run calls from Python (each compiles what it
    calls): the training step or a worker loop, and the evaluation; and the
    layer ops (iasgd.nn.ops) that `plan`, a model's plan table, uses."""
    if not ALGORITHMS[algo].parallel:
        entries = [network.train_steps, network.predict_images]
    elif simulate:  # it measures step times, then makes the workers' calls one at a time
        entries = [network.train_steps, workers.read_step, workers.compute_step, workers.apply_step,
                   network.predict_images]
    else:
        entries = [worker_loop(algo), network.predict_images]
    return entries + (ops.used(plan) if plan is not None else [])


def worker_loop(algo: str) -> Any:
    """The compiled loop that the worker threads of `algo` run."""
    return workers.sync_worker if ALGORITHMS[algo].loop == "sync" else workers.async_worker


def uncached_kernels(algo: str, simulate: bool = False, cache_dir: str | None = None,
                     plan: np.ndarray | None = None) -> list[str]:
    """The names (`module.function`) of those `kernel_entries` that numba's
    on-disk cache (default: iasgd's, iasgd.compiled.CACHE_DIR) lacks: this
    run will compile them first."""
    return [name for name, _ in _uncached(algo, simulate, cache_dir, plan)]


def _uncached(algo: str, simulate: bool, cache_dir: str | None,
              plan: np.ndarray | None) -> list[tuple[str, Any]]:
    # imported here: a module-level import would make this module part of
    # the compiled cache's key (iasgd.compiled), and editing it empty the cache
    from iasgd import compiled

    missing = compiled.uncached(kernel_entries(algo, simulate, plan),
                                None if cache_dir is None else Path(cache_dir))
    return [(compiled.cache_index_name(d).split("-")[0], d) for d in missing]


def jobs(algo: str, plan: np.ndarray, executor: Callable[[], LoadsKernels] | None,
         cache_dir: str | None = None) -> list[Job]:
    """The jobs that compile what a run of `algo` on a model with `plan`
    needs and the cache lacks: one per layer op, one for the steps (or the
    worker loop) and one for the evaluation, each a call of a method of
    `executor()` with stand-in op tables (None: no executor's calls; the
    simulator compiles its own). Not `nothing`, which the run compiles first
    (compile_ahead)."""
    missing = _uncached(algo, False, cache_dir, plan)
    entries = [d for _, d in missing if d not in ops.OPS]
    found: list[Job] = []
    if executor is not None and any(d is not network.predict_images for d in entries):
        seconds = STEPS_COMPILE_S + WORKER_LOOP_COMPILE_S * ALGORITHMS[algo].parallel
        found.append(Job("steps", seconds,
                         lambda: _with_stand_ins(executor, lambda e: e.load_steps())))
    if executor is not None and network.predict_images in entries:
        found.append(Job("evaluation", EVALUATION_COMPILE_S,
                         lambda: _with_stand_ins(executor, lambda e: e.load_evaluation()),
                         deferred=True))
    # `nothing` is compiled before the children start (compile_ahead)
    return found + [Job(name, op_seconds(d), _op_compiler(d), load_early=True)
                    for name, d in missing if d in ops.OPS and d is not nothing]


def op_seconds(op: Any) -> float:
    """About how long compiling the layer op `op` takes."""
    return ops.COMPILE_S[op]  # each kind of row's estimates (iasgd.nn.layers)


def _load(job: Job) -> None:
    # while the children compile the rest: loading each op takes ~0.1 s
    if job.load_early:
        job.run()


def _op_compiler(op: Any) -> Callable[[], Any]:
    return lambda: ops.compiled_op(op)


def _with_stand_ins(executor: Callable[[], LoadsKernels],
                    load: Callable[[LoadsKernels], None]) -> None:
    # the executor too is built inside: its Net, and any it builds as it loads
    with ops.stand_ins():
        load(executor())


def shares(todo: list[Job], processes: int) -> list[list[Job]]:
    """`todo` split over at most `processes` children as they would take the
    jobs if each took as long as estimated: longest job first, each to the
    child with the least work so far."""
    split: list[list[Job]] = [[] for _ in range(max(1, min(processes, len(todo))))]
    for job in sorted(todo, key=lambda j: -j.seconds):
        min(split, key=lambda share: sum(j.seconds for j in share)).append(job)
    return [share for share in split if share]


def compile_seconds(todo: list[Job], processes: int) -> float:
    """About how long compiling `todo` takes with `processes` children (0:
    in-process, one job after another): the longest share, and loading what
    the children cached; with children, the deferred jobs do not count."""
    if processes:
        todo = [job for job in todo if not job.deferred]
    if not todo:
        return 0.0
    longest = max(sum(j.seconds for j in share) for share in shares(todo, processes))
    return longest + LOAD_S * (processes > 0)


def compile_estimate(algo: str, plan: np.ndarray, cores: int, simulate: bool = False) -> int:
    """About how many seconds a run of `algo` on a model with `plan` spends
    compiling before it starts, on `cores` cores (0: the cache has it all;
    else at least 2, to say something). A simulated run compiles its entries
    in-process, after the ops."""
    todo = jobs(algo, plan, None if simulate else _not_called)
    seconds = compile_seconds(todo, children(todo, cores))
    if simulate and any(d not in ops.OPS for _, d in _uncached(algo, True, None, plan)):
        seconds += STEPS_COMPILE_S + EVALUATION_COMPILE_S + WORKER_LOOP_COMPILE_S
    return max(round(seconds), 2) if seconds else 0


def _not_called() -> LoadsKernels:
    raise AssertionError("an estimate builds no executor")


def children(todo: list[Job], cores: int) -> int:
    """How many children compile `todo` on `cores` cores: 0 where it is not
    worth it (one job) or processes do not fork."""
    if len(todo) < 2 or cores < 2 or not sys.platform.startswith("linux"):
        return 0
    return min(cores, len(todo), MAX_CHILDREN)


def run_in_children(todo: list[Job], processes: int,
                    finished: Callable[[Job], Any] = lambda job: None) -> list[int]:
    """Run `todo` in `processes` forked children and wait for them; returns
    their exit codes (0: every job it took ran). Each child takes the next
    job, longest first (deferred ones last), when it is done with one, so
    that no child idles while another works through a share that took
    longer than estimated. `finished(job)` runs here as each job is reported
    done (not for one that raised; a job that raises leaves the rest to
    run)."""
    children = Children(todo, processes, finished)
    children.report(until_deferred=False)
    return children.join()


class Children:
    """Forked children that compile a list of jobs (run_in_children)."""

    def __init__(self, todo: list[Job], processes: int, finished: Callable[[Job], Any]):
        for stream in (sys.stdout, sys.stderr):  # else each child prints what they hold again
            stream.flush()
        self.order = sorted(todo, key=lambda j: (j.deferred, -j.seconds))
        self.finished = finished
        self.waiting = {i for i, job in enumerate(self.order) if not job.deferred}
        context = multiprocessing.get_context("fork")
        taken = context.Value("i", 0)  # the position in `order` of the next job to take
        pipes = [context.Pipe(duplex=False) for _ in range(max(1, min(processes, len(todo))))]
        self.procs = [context.Process(target=_take_jobs, args=(self.order, taken, send),
                                      daemon=True, name=f"iasgd-compile-{i}")
                      for i, (_, send) in enumerate(pipes)]
        self.pipes = [receive for receive, _ in pipes]
        try:
            for p in self.procs:
                p.start()
        except BaseException:
            self.stop()
            raise
        for _, send in pipes:  # the children hold theirs: a pipe ends when its child does
            send.close()

    def report(self, until_deferred: bool) -> None:
        """Call `finished` with each job that a child reports done, until
        every child has ended (until_deferred: until only deferred jobs are
        left). Interrupted: takes the children down."""
        try:
            while self.pipes and not (until_deferred and not self.waiting):
                for pipe in multiprocessing.connection.wait(self.pipes):
                    try:
                        position = pipe.recv()
                    except EOFError:
                        self.pipes.remove(pipe)
                        continue
                    self.waiting.discard(position)
                    # one that fails here, the run does again itself, and reports
                    # what goes wrong
                    with contextlib.suppress(Exception):
                        self.finished(self.order[position])
        except BaseException:
            self.stop()
            raise

    def join(self) -> list[int]:
        """Wait for the children to end; their exit codes."""
        for p in self.procs:
            p.join()
        return [int(p.exitcode or 0) for p in self.procs]

    def stop(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.terminate()
                p.join()


_DEFERRED: list[Children] = []  # children still compiling deferred jobs


def deferred() -> bool:
    """Whether children of `compile_ahead` may still be compiling deferred jobs."""
    return bool(_DEFERRED)


def load_kernels(executor: LoadsKernels) -> None:
    """Load (or compile) what a run calls from Python, before its clock
    starts: the steps (or the worker loop), and the evaluation unless a cold
    start's child is still compiling it (the first evaluation waits for it)."""
    executor.load_steps()
    if not deferred():
        executor.load_evaluation()


def finish_deferred() -> None:
    """Wait for the deferred jobs that children of `compile_ahead` may still
    be compiling (the evaluation), and load them; at once if there are none.
    Called before the run first evaluates: else it would compile the same
    functions itself, beside the child that caches them."""
    while _DEFERRED:
        children = _DEFERRED.pop()
        children.report(until_deferred=False)
        children.join()


def _take_jobs(order: list[Job], taken: Any, done: Any) -> None:
    # Ctrl-C reaches the whole process group: what it means is the run's to
    # decide (iasgd.run stops at the next step and saves), not the inherited
    # handler's, so a child finishes its jobs unless the run terminates it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    failed = 0
    while (position := _take(taken)) < len(order):
        try:
            order[position].run()
        except Exception:  # the run compiles it itself, and reports what goes wrong
            failed += 1
        else:
            done.send(position)
    sys.exit(1 if failed else 0)


def _take(taken: Any) -> int:
    with taken.get_lock():
        position = taken.value
        taken.value += 1
    return position


def compile_ahead(model: models.Model, algo: str, executor: Callable[[], LoadsKernels] | None,
                  cores: int) -> int:
    """Compile in children (`children` of them on `cores`) what a run of
    `algo` on `model` needs and the cache lacks; `executor` builds the run's
    executor (None: the layer ops only). Returns the number of children (0:
    none were needed or could run; the run compiles in-process)."""
    plan = models.lower(model.arch, model.layout, 1).table
    todo = jobs(algo, plan, executor)
    if todo:  # a cold start: the old code's caches are there to prune
        from iasgd import compiled  # here, for the reason in _uncached

        compiled.prune_caches()
    processes = children(todo, cores)
    if processes:
        # the stand-ins' op, compiled here first: each child inherits numba's
        # compiler with its first-use setup done, instead of each doing it
        ops.compiled_op(nothing)
        compiling = Children(todo, processes, finished=_load)
        compiling.report(until_deferred=True)
        if compiling.pipes:  # the evaluation, still compiling: the run starts
            _DEFERRED.append(compiling)
        else:
            compiling.join()
    return processes
