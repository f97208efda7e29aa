"""Gate.run: worker processes (or threads) on one gate, supervised.

    report = gate.run(worker, args=(model,), processes=4)

runs worker(rank, *args) in each, and meanwhile, every `tick_s`:
- steers the gate's schedules (Gate.tick);
- notices a worker that ended: once its process is gone, whatever its
  steps held comes back (Gate.give_back: tickets returned, intervals
  closed for it), so the others neither wait for it nor lose the bound.
  on_error="stop" (default) then stops the others at their next step and
  raises WorkerError with the worker's traceback; "continue" lets them
  run on and lists the failure in the report.
Ctrl-C: workers ignore SIGINT (a terminal sends it to all of them); the
parent stops the gate, every worker leaves at its next step, one line says
so, and run raises Interrupted (a KeyboardInterrupt, so a script stops as
it would anywhere else) with the report, whose status is "interrupted". A
second Ctrl-C terminates the workers that are still there.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

import torch
import torch.multiprocessing as mp

from iasgd.torch import steps as S
from iasgd.torch.gate import Gate, GateReport, Stopped


class WorkerError(RuntimeError):
    """A worker raised or died (on_error="stop"): the others were stopped."""

    def __init__(self, failures: list[tuple[int, str]], report: GateReport):
        rank, why = failures[0]
        super().__init__(f"worker {rank} failed; the others were stopped:\n{why}")
        self.failures, self.report = failures, report


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped gate.run: every worker left; `report` says how far they got."""

    def __init__(self, report: GateReport):
        super().__init__(f"interrupted: every worker stopped; {report.line()}")
        self.report = report


def _worker_main(gate: Gate, fn: Callable[..., Any], rank: int, args: tuple,
                 torch_threads: int, errors: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us through the gate
    torch.set_num_threads(torch_threads)
    try:
        fn(rank, *args)
    except Stopped:
        pass
    except BaseException:
        errors.put((rank, traceback.format_exc()))
        sys.stderr.flush()
        os._exit(1)


def run(gate: Gate, fn: Callable[..., Any], args: tuple = (), processes: int = 2, *,
        start_method: str | None = None, on_error: str = "stop", seconds: float | None = None,
        torch_threads: int | None = None, tick_s: float = 0.02) -> GateReport:
    """Run fn(rank, *args) for rank in range(processes) on `gate` and wait
    for all (the module doc). start_method: torch.multiprocessing's
    ("fork", "spawn", "forkserver"; None: the platform's default).
    seconds: a time budget (Gate.stop_after). torch_threads: intra-op
    threads per worker (default: the cores shared out, at least 1, as
    PyTorch's Hogwild! example does). Threads are not offered: they share
    one module's .grad, and with a replica each they ran 0.87-0.91 of the
    processes' samples/s (docs/pytorch.md); the gate itself works from
    threads (a row each) for a loop that starts its own."""
    if on_error not in ("stop", "continue"):
        raise ValueError(f"on_error must be 'stop' or 'continue', not {on_error!r}")
    if processes > gate.workers:
        raise ValueError(f"{processes} processes but the gate has rows for {gate.workers}: "
                         "make it with workers >= processes")
    unshared = unshared_argument(args)
    if unshared is not None:
        raise ValueError(unshared)
    gate.warm()
    if seconds is not None:
        gate.stop_after(seconds)
    ctx = mp.get_context(start_method)
    errors = ctx.SimpleQueue()
    per = torch_threads or max(1, (os.cpu_count() or 1) // processes)
    procs = {}
    failures: list[tuple[int, str]] = []
    try:  # from the first start: a Ctrl-C while workers start stops those started
        for rank in range(processes):
            p = ctx.Process(target=_worker_main, args=(gate, fn, rank, args, per, errors),
                            name=f"iasgd-torch-{rank}")
            p.start()
            procs[p.sentinel] = (rank, p)
        while procs:
            for sentinel in wait(list(procs), timeout=tick_s):
                rank, p = procs.pop(sentinel)
                p.join()
                gate.give_back(p.pid)
                if p.exitcode != 0:
                    why = (f"exit code {p.exitcode}" if p.exitcode > 0
                           else f"killed by signal {-p.exitcode}")
                    failures.append((rank, why))
                    if on_error == "stop":
                        gate.stop(S.FAILED)
            gate.tick()
    except KeyboardInterrupt:
        gate.stop(S.INTERRUPTED)
        _join_after_interrupt(gate, list(procs.values()))
        report = gate.report()
        print(f"interrupted: every worker stopped; {report.line()}", file=sys.stderr)
        raise Interrupted(report) from None
    gate.stop(S.COMPLETED)  # every worker is done (a reason given before stays)
    told = {}
    while not errors.empty():
        rank, text = errors.get()
        told[rank] = text
    failures = [(rank, told.get(rank, why)) for rank, why in failures]
    report = gate.report()
    report.failures = failures
    if failures and on_error == "stop":
        raise WorkerError(failures, report)
    return report


def unshared_argument(args: tuple) -> str | None:
    """What a worker would train a copy of, said in one line, or None: the
    first module among `args` (in tuples, lists and dict values too) with a
    parameter or buffer outside shared memory, optimiser over such
    parameters, or tensor that requires grad outside it. A forked worker
    writes such a tensor's private copy, so the parent's model would come
    back unchanged although every step was taken."""
    for where, value in _arguments(args, "args"):
        if isinstance(value, torch.nn.Module):
            tensors, what = [*value.parameters(), *value.buffers()], "its parameters are"
            fix = "call model.share_memory() before gate.run"
        elif isinstance(value, torch.optim.Optimizer):
            tensors = [t for group in value.param_groups for t in group["params"]]
            what = "the parameters it was built over are"
            fix = ("call model.share_memory() before building it, or build it in the worker "
                   "over the shared model's parameters")
        elif isinstance(value, torch.Tensor) and value.requires_grad:
            tensors, what, fix = [value], "it is", "call share_memory_() on it before gate.run"
        else:
            continue
        if any(not t.is_shared() for t in tensors):
            return (f"{where} ({type(value).__name__}): {what} not in shared memory, so "
                    f"every worker would train a copy of its own and the model would come back "
                    f"unchanged; {fix}")
    return None


def _arguments(value: Any, where: str):
    """(where, value) for `value` and everything inside its tuples, lists
    and dicts, outermost first."""
    yield where, value
    if isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            yield from _arguments(item, f"{where}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _arguments(item, f"{where}[{key!r}]")


def _join_after_interrupt(gate: Gate, left: list[tuple[int, Any]]) -> None:
    """Wait for the workers to leave; terminate them on a second Ctrl-C."""
    try:
        for _, p in left:
            p.join()
    except KeyboardInterrupt:
        for _, p in left:
            if p.is_alive():
                p.terminate()
        for _, p in left:
            p.join()
    for _, p in left:
        gate.give_back(p.pid)
