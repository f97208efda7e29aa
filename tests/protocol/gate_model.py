"""An interleaving model of the gate: the real worker loop and gate functions,
run as plain Python on model threads in which every atomic operation is one
step that a scheduler grants.

The model is the code itself: `worker_namespace()` rebuilds the Python bodies
of iasgd.protocol.gate's and iasgd.protocol.workers' compiled functions (numba keeps them as
`py_func`) over model atomics, so whatever gate.py and workers.py say is what
the model executes, step by step. The gradient math is stubbed out; only the
protocol runs. Each model thread is a real Python thread that runs its code
up to its next atomic operation and then waits for the scheduler; exactly one
model thread moves at a time, so a run is a sequence of thread choices, which
hypothesis picks (tests/protocol/test_gate.py).

Futexes have no timeouts here and time does not pass (monotonic_ns is 0): a
lost wake-up shows as a state where every unfinished thread sleeps, which the
checker reports as a deadlock, where the real code would limp on at 10 ms per
sleep.

The checker watches every step (omniscient, between steps) and asserts:
- an update is applied in the interval it read in (generation at the read ==
  generation at begin_apply), with tau <= y(its interval) - 1;
- an open interval's y does not change, at most y slots are taken, and slots
  in flight never outnumber tickets in flight;
- the next interval opens only when exactly y updates of the current one were
  applied and written;
- TICKETS <= LIMIT, DONE <= TICKETS; at the end of a run that was not stopped,
  DONE == VERSION == every allowed ticket (applied per epoch == tickets);
- liveness: some thread can always move until every thread has finished.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from iasgd.protocol import gate, workers

LOW32 = (1 << 32) - 1


class Aborted(BaseException):
    """Raised inside a model thread to end it (the example is over)."""


class ModelError(AssertionError):
    """An invariant of the gate failed in the model."""


@dataclass
class ModelThread:
    name: str
    program: Callable[[], None]
    go: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    blocked_on: int | None = None  # futex word this thread sleeps on
    done: bool = False
    error: BaseException | None = None
    thread: threading.Thread | None = None


class Scheduler:
    """Runs model threads one atomic step at a time."""

    def __init__(self, state: np.ndarray):
        self.state = state
        self.threads: list[ModelThread] = []
        self.back = threading.Semaphore(0)  # a model thread reached its next step
        self.local = threading.local()
        self.aborted = False
        self.steps = 0
        self.after_step: Callable[[ModelThread], None] = lambda t: None

    # ---- inside model threads

    def me(self) -> ModelThread | None:
        return getattr(self.local, "thread", None)

    def pause(self) -> None:
        """Wait for the grant of this thread's next atomic step."""
        t = self.me()
        if t is None:  # outside the model (setup code): run straight through
            return
        self.back.release()
        t.go.acquire()
        if self.aborted:
            raise Aborted

    def _run(self, t: ModelThread) -> None:
        self.local.thread = t
        try:
            t.go.acquire()
            if self.aborted:
                raise Aborted
            t.program()
        except Aborted:
            pass
        except BaseException as err:  # reported by the scheduler
            t.error = err
        finally:
            t.done = True
            self.back.release()

    # ---- the scheduler's side

    def spawn(self, name: str, program: Callable[[], None]) -> None:
        t = ModelThread(name, program)
        t.thread = threading.Thread(target=self._run, args=(t,), daemon=True)
        self.threads.append(t)
        t.thread.start()

    def runnable(self) -> list[ModelThread]:
        return [t for t in self.threads if not t.done and t.blocked_on is None]

    def step(self, t: ModelThread) -> None:
        """Let t perform one atomic step (and the local code after it)."""
        t.go.release()
        self.back.acquire()
        self.steps += 1
        if t.error is not None:
            raise t.error
        self.after_step(t)

    def finished(self) -> bool:
        return all(t.done for t in self.threads)

    def close(self) -> None:
        """End every model thread still alive."""
        self.aborted = True
        for t in self.threads:
            if not t.done:
                t.go.release()
        for t in self.threads:
            if t.thread is not None:
                t.thread.join(5)

    # ---- the atomics, as steps

    def atomics(self) -> dict[str, Callable]:
        def atomic_add(arr, i, v):
            self.pause()
            old = int(arr[i])
            arr[i] = old + int(v)
            return old

        def atomic_cas(arr, i, expected, new):
            self.pause()
            old = int(arr[i])
            if old == int(expected):
                arr[i] = int(new)
            return old

        def atomic_load(arr, i):
            self.pause()
            return int(arr[i])

        def atomic_store(arr, i, v):
            self.pause()
            arr[i] = int(v)

        def cpu_relax():
            self.pause()

        def sleep_us(us):
            self.pause()

        def monotonic_ns():
            return 0  # time does not pass: futex timeouts never fire

        def futex_wait(arr, i, expected, timeout_us):
            self.pause()
            t = self.me()
            if t is None or (int(arr[i]) & LOW32) != (int(expected) & LOW32):
                return
            t.blocked_on = i  # asleep until a futex_wake_all on word i
            self.back.release()
            t.go.acquire()
            if self.aborted:
                raise Aborted

        def futex_wake_all(arr, i):
            self.pause()
            for t in self.threads:
                if t.blocked_on == i:
                    t.blocked_on = None

        return {name: fn for name, fn in locals().items() if callable(fn)}


def _rebuild(module: types.ModuleType, overrides: dict) -> dict:
    """The module's globals with `overrides`, in which every function the
    module compiles is its Python body bound to these globals."""
    namespace = dict(vars(module))
    namespace.update(overrides)
    for name, obj in vars(module).items():
        body = getattr(obj, "py_func", obj)
        if (isinstance(body, types.FunctionType) and body.__module__ == module.__name__
                and name not in overrides):
            namespace[name] = types.FunctionType(body.__code__, namespace, name,
                                                 body.__defaults__, body.__closure__)
    return namespace


def gate_namespace(scheduler: Scheduler, wrap: dict | None = None) -> types.SimpleNamespace:
    """iasgd.protocol.gate over the scheduler's atomics; `wrap` maps a function name to
    a decorator for it (the checker's hooks)."""
    # two spins before a waiter sleeps, not 64: the same code, with the
    # sleeping path reachable in a few steps
    namespace = _rebuild(gate, {**scheduler.atomics(), "SPIN_ROUNDS": 2})
    for name, decorate in (wrap or {}).items():
        namespace[name] = decorate(namespace[name])
    return types.SimpleNamespace(**namespace)


def _stub_kernels() -> types.SimpleNamespace:
    return types.SimpleNamespace(
        network_loss_and_grad=lambda *args: 1.0,  # the step's gradient math
        sgd_momentum_update=lambda *args: None,
    )


def worker_namespace(scheduler: Scheduler, g: types.SimpleNamespace) -> types.SimpleNamespace:
    """iasgd.protocol.workers over the model gate `g`, with the math stubbed out."""
    overrides = dict(scheduler.atomics())
    overrides.update(G=g, K=_stub_kernels(), _load_batch=lambda *args: None,
                     _enter_step=lambda probe: None, _leave_step=lambda probe: None)
    return types.SimpleNamespace(**_rebuild(workers, overrides))


# --------------------------------------------------------------- the checker


@dataclass
class Update:
    read_gen: int
    v_read: int
    applying_gen: int | None = None


class Checker:
    """Book-keeping of one model run and the invariants of the module doc."""

    def __init__(self, scheduler: Scheduler, interval: bool):
        self.s, self.state, self.interval = scheduler, scheduler.state, interval
        self.y_of: dict[int, int] = {}
        self.begun_in: dict[int, int] = {}
        self.updates: dict[str, Update] = {}  # by model thread: its step in flight
        self.gen_seen = -1
        self.applied = 0

    def word(self) -> tuple[int, int]:
        word = int(self.state[gate.GEN_TAKEN])
        return word >> 32, word & LOW32

    def hooks(self) -> dict:
        def read_version(fn):
            def hooked(state):
                v = fn(state)
                gen, _ = self.word()
                self.updates[self.s.me().name] = Update(gen, v)
                return v
            return hooked

        def begin_apply(fn):
            def hooked(state):
                v = fn(state)
                self.on_begin_apply(v)
                return v
            return hooked

        def finish_apply(fn):
            def hooked(state):
                opened = fn(state)
                self.updates.pop(self.s.me().name, None)
                return opened
            return hooked

        def settle(fn):
            def hooked(state):
                self.updates.pop(self.s.me().name, None)
                return fn(state)
            return hooked

        return {"read_version": read_version, "begin_apply": begin_apply,
                "finish_apply": finish_apply, "settle": settle}

    def fail(self, what: str) -> None:
        raise ModelError(f"{what} (after {self.s.steps} steps; state {self.state.tolist()})")

    def on_begin_apply(self, v_before: int) -> None:
        u = self.updates.get(self.s.me().name)
        if u is None:
            self.fail("an update was applied without a read")
        self.applied += 1
        if not self.interval:
            return
        gen, _ = self.word()
        if gen != u.read_gen:
            self.fail(f"an update read in interval {u.read_gen} was applied in {gen}")
        y = self.y_of[gen]
        tau = v_before - u.v_read
        if not 0 <= tau <= y - 1:
            self.fail(f"tau {tau} outside [0, {y - 1}] in interval {gen}")
        self.begun_in[gen] = self.begun_in.get(gen, 0) + 1
        if self.begun_in[gen] > y:
            self.fail(f"{self.begun_in[gen]} updates applied in interval {gen} of y={y}")
        u.applying_gen = gen

    def after_step(self, t: ModelThread) -> None:
        s = self.state
        if not s[gate.DONE] <= s[gate.TICKETS] <= s[gate.LIMIT]:
            self.fail("DONE <= TICKETS <= LIMIT broken")
        if not self.interval:
            return
        gen, taken = self.word()
        closing = taken >= gate.CLOSED
        if gen != self.gen_seen and not closing:
            if gen != self.gen_seen + 1:
                self.fail(f"interval {gen} opened after {self.gen_seen}")
            if self.gen_seen >= 0:
                done = self.begun_in.get(self.gen_seen, 0)
                if done != self.y_of[self.gen_seen]:
                    self.fail(f"interval {gen} opened after {done} of "
                              f"{self.y_of[self.gen_seen]} updates of {self.gen_seen}")
                for name, u in self.updates.items():
                    if u.applying_gen == self.gen_seen and name != t.name:
                        self.fail(f"interval {gen} opened while {name} was still applying")
            self.gen_seen = gen
            self.y_of[gen] = int(s[gate.Y])
        if gen == self.gen_seen and not closing:
            y = self.y_of[gen]
            if int(s[gate.Y]) != y:
                self.fail(f"y of open interval {gen} changed from {y} to {int(s[gate.Y])}")
            if taken > y:
                self.fail(f"{taken} slots taken in interval {gen} of y={y}")
            in_flight_slots = taken - int(s[gate.APPLIED])
            in_flight_tickets = int(s[gate.TICKETS]) - int(s[gate.DONE])
            if in_flight_slots > in_flight_tickets:
                self.fail(f"{in_flight_slots} slots in flight but {in_flight_tickets} tickets")


# ------------------------------------------------------------------ one run


@dataclass
class Scenario:
    """One model run. algo: workers.HOGWILD, ASYNC or INTERVAL; policy:
    gate.WAIT or DROP; actions: what the controller does, in order, at the
    moments the schedule gives it: ("y", v) puts v into Y_NEXT, ("m", v)
    sets the active count, ("stop",) stops the run."""

    algo: int
    policy: int
    threads: int
    y: int
    quota: int  # tickets per epoch
    epochs: int
    actions: list[tuple] = field(default_factory=list)
    m0: int | None = None


def _worker_args(state: np.ndarray, wid: int, sc: Scenario, shared_arrays: dict) -> tuple:
    """async_worker's arguments for a tiny problem (the math is stubbed out)."""
    P, bins, f32 = 4, 64, np.float32
    plan = workers.Plan(sc.algo, sc.policy, 0.1, 0.5)
    shared = workers.Shared(state, shared_arrays["probe"], shared_arrays["params"],
                            np.zeros(P, f32), np.ones(bins, f32), np.zeros(8))
    inputs = workers.Inputs(np.zeros((4, 2), np.uint8), np.zeros(4, np.int64), 1.0, 0.0)
    own = workers.Own(np.zeros(P, f32), np.zeros(P, f32), np.zeros(2, f32), np.zeros(2, f32),
                      np.zeros(2, np.int64), np.zeros((0, 8), np.int64), np.zeros(1, np.int64),
                      np.zeros(1, np.int64), np.zeros(1, np.uint64),
                      np.zeros(workers.COUNTER_COLUMNS, np.int64), np.zeros(bins, np.int64),
                      np.zeros(1))
    return wid, plan, shared, inputs, own


def run_scenario(sc: Scenario, choices: list[int], finish_steps: int = 20_000) -> dict:
    """Run `sc` with thread choices `choices` (each picks among the runnable
    threads, modulo their number), then round-robin until every thread has
    finished. Raises ModelError on a broken invariant, a deadlock or a run
    that does not finish in `finish_steps` steps. Returns the final state."""
    interval = sc.algo == workers.INTERVAL
    state = gate.new_state(sc.y if interval else gate.UNBOUNDED,
                           active=sc.m0 if sc.m0 is not None else sc.threads)
    s = Scheduler(state)
    checker = Checker(s, interval)
    g = gate_namespace(s, checker.hooks())
    w = worker_namespace(s, g)
    s.after_step = checker.after_step
    stopped_by_controller = []

    def main():
        for epoch in range(1, sc.epochs + 1):
            if g.stopped(state):
                return
            g.allow(state, epoch * sc.quota)
            while not g.wait_settled(state, 10**9):
                pass
        g.request_stop(state)

    def controller():
        for action in sc.actions:
            if action[0] == "y":
                g.atomic_store(state, gate.Y_NEXT, action[1])
            elif action[0] == "m":
                g.set_active(state, action[1])
            else:
                stopped_by_controller.append(True)
                g.request_stop(state)

    shared_arrays = {"probe": np.zeros(8, np.int64), "params": np.zeros(4, np.float32)}
    for wid in range(sc.threads):
        args = _worker_args(state, wid, sc, shared_arrays)
        s.spawn(f"worker-{wid}", lambda args=args: w.async_worker(*args))
    s.spawn("main", main)
    s.spawn("controller", controller)
    try:
        for t in s.threads:  # each runs up to its first step
            t.go.release()
            s.back.acquire()
        for choice in choices:
            ready = s.runnable()
            if not ready:
                break
            s.step(ready[choice % len(ready)])
        for turn in range(finish_steps):
            ready = s.runnable()
            if not ready:
                break
            s.step(ready[turn % len(ready)])
        if not s.finished():
            asleep = [t.name for t in s.threads if not t.done]
            what = "deadlock: all asleep" if not s.runnable() else "no progress"
            checker.fail(f"{what}: {asleep} have not finished")
        if not stopped_by_controller:
            allowed = sc.epochs * sc.quota
            if not state[gate.DONE] == state[gate.VERSION] == allowed:
                checker.fail(f"{allowed} tickets allowed but DONE {state[gate.DONE]}, "
                             f"VERSION {state[gate.VERSION]}")
        return {"state": state.copy(), "steps": s.steps, "applied": checker.applied}
    finally:
        s.close()
