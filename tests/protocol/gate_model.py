"""An interleaving model of the gate: the real worker loop and gate functions,
run as plain Python on model threads in which every atomic operation is one
step that a scheduler grants.

The model is the code itself: `worker_namespace()` rebuilds the Python bodies
of iasgd.protocol.gate's and iasgd.protocol.workers' compiled functions (numba
keeps them as `py_func`) over model atomics, so whatever gate.py and
workers.py say is what the model executes, step by step. The gradient math is
stubbed out, but not what it reads and writes: the shared parameters are a
`ModelParams` whose every element read and element write is a step of its
own, a gradient reads every element (a step each), an update adds exactly 1
to every element (a step each), and async's snapshot copies element by
element. So a write that the code puts in the wrong place (after its
interval closed, outside async's lock) interleaves with reads as it would on
real cores. Each model thread is a real Python thread that runs its code
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
- liveness: some thread can always move until every thread has finished;
- visibility, what the parameters hold: a gradient read in interval k sees
  every update of intervals before k completely written (checked at each
  element it reads), and interval k + 1 opens only when every update of k is
  written; an async snapshot is never torn and holds exactly the v_read
  updates that V counted when it was taken; an update writes only after V
  counts it (begin_apply), and only once; at the end every update V counts
  is written, exactly once, into every element.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from iasgd.nn.plan import plain_sgd
from iasgd.protocol import gate, workers

LOW32 = (1 << 32) - 1
STEP_BOUND_S = 30  # far above any step's microseconds, even on a busy machine
PARAMS = 3  # elements of the model's parameters: a write or a read is 3 steps


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
        self.wait_back(t)
        self.steps += 1
        if t.error is not None:
            raise t.error
        self.after_step(t)

    def wait_back(self, t: ModelThread) -> None:
        """Wait for t to reach its next atomic step. A step is a few lines of
        Python: one that does not come back in STEP_BOUND_S seconds loops or
        blocks outside the atomics (a bug the model cannot schedule), and the
        example fails, naming it, instead of hanging the suite."""
        if not self.back.acquire(timeout=STEP_BOUND_S):
            raise ModelError(f"{t.name} did not reach its next atomic step in {STEP_BOUND_S} s: "
                             "a loop or a block outside the model's atomics")

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

        futex_wait_shared, futex_wake_all_shared = futex_wait, futex_wake_all  # one flavour here
        return {name: fn for name, fn in locals().items() if callable(fn)}


class ModelParams:
    """The shared parameters (P elements): each element read and each element
    write is one scheduler step. An update adds 1 to every element, so an
    element's value counts the updates written into it."""

    def __init__(self, scheduler: Scheduler, size: int):
        self.s = scheduler
        self.values = np.zeros(size, np.int64)
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> int:
        self.s.pause()
        return int(self.values[i])

    def add_one(self, i: int) -> None:
        self.s.pause()
        self.values[i] += 1


class ModelSnapshot:
    """A worker's private copy (async's `own.local`): `copy_values(params,
    local)` copies element by element, each read of the shared array a step."""

    def __init__(self, size: int):
        self.values = np.zeros(size, np.int64)
        self.size = size

    def __setitem__(self, where: slice, source: ModelParams) -> None:
        for i in range(self.size):
            self.values[i] = source[i]


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


def _model_kernels(checker: Checker | None) -> types.SimpleNamespace:
    """The kernels a step calls, as reads and writes of the model arrays: a
    gradient reads every element of what it is computed at, an update adds 1
    to every element; the checker sees each."""
    def network_loss_and_grad(params, *rest):
        if isinstance(params, ModelParams):
            for i in range(params.size):
                _ = params[i]  # the read is the step
                if checker is not None:
                    checker.on_shared_read()
        elif isinstance(params, ModelSnapshot) and checker is not None:
            checker.on_snapshot(params.values)
        return 1.0

    def sgd_momentum_update(params, *rest):
        if checker is not None:
            checker.on_write(begin=True)
        for i in range(params.size):
            params.add_one(i)
        if checker is not None:
            checker.on_write(begin=False)

    def copy_values(src, dst):
        dst[:] = src  # a ModelSnapshot reads the source element by element

    def scheduled_lr(sgd, update):
        return sgd.lr  # the model's write adds one, whatever the step size

    return types.SimpleNamespace(network_loss_and_grad=network_loss_and_grad,
                                 sgd_momentum_update=sgd_momentum_update,
                                 apply_update=sgd_momentum_update,
                                 loss_smoothing=lambda sgd, knobs: 0.0,
                                 scheduled_lr=scheduled_lr,
                                 copy_values=copy_values)


def worker_namespace(scheduler: Scheduler, g: types.SimpleNamespace,
                     checker: Checker | None = None) -> types.SimpleNamespace:
    """iasgd.protocol.workers over the model gate `g`, its kernels reading
    and writing the model arrays (what the checker watches)."""
    overrides = dict(scheduler.atomics())
    kernels = _model_kernels(checker)
    overrides.update(G=g, N=kernels, copy_values=kernels.copy_values,
                     _load_batch=lambda *args: None,
                     _enter_step=lambda probe: None, _leave_step=lambda probe: None)
    return types.SimpleNamespace(**_rebuild(workers, overrides))


# --------------------------------------------------------------- the checker


@dataclass
class Update:
    read_gen: int
    v_read: int
    applying_gen: int | None = None
    counted: bool = False  # begin_apply has counted it in V
    counted_in: int = 0  # the interval it was counted in (0 without intervals)
    writes: int = 0  # writes begun (must be at most 1)
    written: bool = False  # its write into every element has ended


class Checker:
    """Book-keeping of one model run and the invariants of the module doc."""

    def __init__(self, scheduler: Scheduler, interval: bool):
        self.s, self.state, self.interval = scheduler, scheduler.state, interval
        self.y_of: dict[int, int] = {}
        self.begun_in: dict[int, int] = {}
        self.updates: dict[str, Update] = {}  # by model thread: its step in flight
        self.gen_seen = -1
        self.applied = 0
        self.written_in: dict[int, int] = {}  # updates completely written, by interval
        self.written = 0

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
                u = self.updates.get(self.s.me().name)
                opened = fn(state)
                if u is not None:
                    u.applying_gen = None  # its interval's apply is over
                return opened
            return hooked

        return {"read_version": read_version, "begin_apply": begin_apply,
                "finish_apply": finish_apply}

    def fail(self, what: str) -> None:
        raise ModelError(f"{what} (after {self.s.steps} steps; state {self.state.tolist()})")

    def on_begin_apply(self, v_before: int) -> None:
        u = self.updates.get(self.s.me().name)
        if u is None:
            self.fail("an update was applied without a read")
        self.applied += 1
        u.counted = True
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
        u.counted_in = gen

    # ---- what the parameters hold

    def on_write(self, begin: bool) -> None:
        """An update's write into every element begins or ends."""
        u = self.updates.get(self.s.me().name)
        if u is None or not u.counted:
            self.fail("an update is written that V has not counted (before begin_apply)")
        if begin:
            u.writes += 1
            if u.writes > 1:
                self.fail("an update is written twice")
            return
        u.written = True
        self.written += 1
        self.written_in[u.counted_in] = self.written_in.get(u.counted_in, 0) + 1

    def unwritten_before(self, gen: int) -> list[int]:
        """Intervals before `gen` with updates not completely written."""
        return [g for g in range(gen) if self.written_in.get(g, 0) < self.y_of.get(g, 0)]

    def on_shared_read(self) -> None:
        """A gradient reads an element of the shared parameters: in interval k
        it must see every update of the intervals before k written."""
        if not self.interval:
            return
        u = self.updates.get(self.s.me().name)
        missing = self.unwritten_before(u.read_gen)
        if missing:
            self.fail(f"a gradient read in interval {u.read_gen} sees interval {missing[0]}'s "
                      f"updates not all written ({self.written_in.get(missing[0], 0)} of "
                      f"{self.y_of[missing[0]]})")

    def on_snapshot(self, values: np.ndarray) -> None:
        """Async computes at its snapshot: it holds, in every element, exactly
        the updates V counted when it was read."""
        u = self.updates.get(self.s.me().name)
        if not (values == values[0]).all():
            self.fail(f"a torn snapshot: {values.tolist()}")
        if int(values[0]) != u.v_read:
            self.fail(f"a snapshot read at V = {u.v_read} holds {int(values[0])} updates")

    def check_all_written(self, params: ModelParams) -> None:
        """At the end: every update V counts is written, once, into every element."""
        version = int(self.state[gate.VERSION])
        if self.written != version or not (params.values == version).all():
            self.fail(f"V counts {version} updates, {self.written} writes ended, the "
                      f"elements hold {params.values.tolist()}")

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
                if self.unwritten_before(gen):
                    self.fail(f"interval {gen} opened before every update of "
                              f"{self.gen_seen} was written")
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
    P, bins, f32 = shared_arrays["params"].size, 64, np.float32
    rule = workers.StepRule(sc.algo, sc.policy, plain_sgd(0.1, 0.5))
    shared = workers.Shared(state, shared_arrays["probe"], shared_arrays["params"],
                            np.zeros(P, f32), np.ones(bins, f32), np.zeros(8))
    inputs = workers.Inputs(np.zeros((4, 2), np.uint8), np.zeros(4, np.int64), 1.0, 0.0)
    own = workers.Own(ModelSnapshot(P), np.zeros(P, f32), np.zeros(2, f32), np.zeros(2, f32),
                      np.zeros(2, np.int64), np.zeros((0, 8), np.int64), np.zeros(1, np.int64),
                      np.zeros(1, np.int64), np.zeros(1, np.uint64),
                      np.zeros(workers.COUNTER_COLUMNS, np.int64), np.zeros(bins, np.int64),
                      np.zeros(1), np.zeros((1, 3), np.int64))
    return wid, rule, shared, inputs, own, None, None  # no augmentation, the paper's step


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
    w = worker_namespace(s, g, checker)
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

    params = ModelParams(s, PARAMS)
    shared_arrays = {"probe": np.zeros(8, np.int64), "params": params}
    for wid in range(sc.threads):
        args = _worker_args(state, wid, sc, shared_arrays)
        s.spawn(f"worker-{wid}", lambda args=args: w.async_worker(*args))
    s.spawn("main", main)
    s.spawn("controller", controller)
    try:
        for t in s.threads:  # each runs up to its first step
            t.go.release()
            s.wait_back(t)
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
        checker.check_all_written(params)
        if not stopped_by_controller:
            allowed = sc.epochs * sc.quota
            if not state[gate.DONE] == state[gate.VERSION] == allowed:
                checker.fail(f"{allowed} tickets allowed but DONE {state[gate.DONE]}, "
                             f"VERSION {state[gate.VERSION]}")
        return {"state": state.copy(), "steps": s.steps, "applied": checker.applied}
    finally:
        s.close()
