"""A step of iasgd.torch that ends without its write: left by an exception
(in the block, in the write, in the read), by `break` or `return` without
`step.apply`, or by a worker that dies and whose step the parent gives
back. Whatever the step held (a ticket; a slot of its interval; a write
counted in V) must come back: afterwards no ticket is outstanding, the
interval still opens after exactly y applies (the slot a left step held is
filled by an empty update, counted in V), the `left` counter counts the
step, and a run with max_updates still completes all of them.

Most tests drive the compiled calls of iasgd.torch.steps (begin,
start_write, end_write, give_back) or the Step API in this one process and
read the gate's words (iasgd.protocol.gate's state, the rows' PHASE, LEFT,
...) after each call: deterministic, no timing. A "dead" worker is a row
with a pid no process has (above Linux's pid_max): the parent's
Gate.give_back(pid) is what Gate.run calls once a worker process is gone.
Every call that could sleep (a slot or a ticket none is left of) is guarded
first, so a step that failed to give something back fails its test with a
message instead of hanging it."""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import threading
import time

import pytest

torch = pytest.importorskip("torch")
it = pytest.importorskip("iasgd.torch")

from iasgd.protocol import gate as G  # noqa: E402
from iasgd.protocol import workers as W  # noqa: E402
from iasgd.torch import steps as S  # noqa: E402

Y = 3
LOW32 = (1 << 32) - 1
NO_PROCESS = 1 << 40  # a pid no process has: a dead worker's row


def words(gate) -> dict[str, int]:
    """The gate's words, as iasgd.protocol.gate names them."""
    s = gate.state
    return {"gen": int(s[G.GEN_TAKEN]) >> 32, "taken": int(s[G.GEN_TAKEN]) & LOW32,
            "applied": int(s[G.APPLIED]), "V": int(s[G.VERSION]),
            "intervals": int(s[G.INTERVALS]), "tickets": int(s[G.TICKETS]),
            "done": int(s[G.DONE]), "active": int(gate.control[W.ACTIVE])}


def outstanding(gate) -> int:
    """Tickets handed out and neither returned nor settled."""
    return int(gate.state[G.TICKETS]) - int(gate.state[G.DONE])


class Worker:
    """One worker's row, driven call by call (what Step does, without the
    Python around it). pid: the row's owner (default: a dead one)."""

    def __init__(self, gate, pid: int = NO_PROCESS):
        self.gate = gate
        self.r = int(S.claim_row(gate.control, gate.workers))
        assert self.r >= 0
        self.pid = pid + self.r if pid == NO_PROCESS else pid
        gate.rows[self.r, S.PID] = self.pid

    @property
    def row(self):
        return self.gate.rows[self.r]

    @property
    def phase(self) -> int:
        return int(self.row[S.PHASE])

    @property
    def left(self) -> int:
        return int(self.row[S.LEFT])

    def begin(self) -> int:
        g = self.gate
        w = words(g)
        assert w["tickets"] < int(g.state[G.LIMIT]), f"no ticket left (it would sleep): {w}"
        if g.wait:
            assert w["taken"] < int(g.state[G.Y]), f"no slot left (it would sleep): {w}"
        gen = S.begin(g.state, self.row, g.control, g.code, g.wait)
        assert gen >= 0
        S.end_read(g.state, self.row)
        return gen

    def start_write(self) -> int:
        g = self.gate
        return S.start_write(g.state, self.row, g.control, g.code, g.drop)

    def end_write(self) -> bool:
        g = self.gate
        return S.end_write(g.state, self.row, g.hists[self.r], g.control, g.ring, g.code,
                           math.nan)

    def step(self) -> None:
        self.begin()
        assert self.start_write() >= 0
        self.end_write()

    def give_back(self) -> int:
        """In its own process (what Step.__exit__ calls)."""
        g = self.gate
        return S.give_back(g.state, self.row, g.control, g.code)

    def hold(self, phase: str) -> int:
        """Hold a step in `phase`; returns its S phase code."""
        g = self.gate
        self.begin()
        if phase == "ticket":
            assert g.drop  # the wait policy takes its slot in begin
        elif phase == "slot" and g.drop:
            # killed right after start_write's commit claimed its slot, before
            # the count in V (the record, as start_write writes it)
            assert G.commit_step(g.state, int(self.row[S.GEN]), True)
            self.row[S.PHASE] = S.SLOT
        elif phase == "writing":
            assert self.start_write() >= 0
        assert self.phase == {"ticket": S.TICKET, "slot": S.SLOT, "writing": S.WRITING}[phase]
        return self.phase


def open_by_applying(gate, worker=None) -> int:
    """Apply one step at a time (one worker, nothing else in flight) until
    interval 0 opens the next; returns how many it took, checking the words
    at every apply: V counts every apply of the interval and the next one
    opens with the y-th (V == y), not before."""
    applies = 0
    while words(gate)["gen"] == 0:
        w = words(gate)
        assert w["applied"] == w["V"] < Y, f"interval 0 past y applies but not open: {w}"
        if gate.wait:
            assert w["taken"] < Y, f"every slot taken, {w['applied']} applied: it never opens: {w}"
        if worker is None:
            with gate.step() as step:
                step.apply()
        else:
            worker.step()
        applies += 1
    w = words(gate)
    assert (w["gen"], w["taken"], w["applied"], w["intervals"], w["V"]) == (1, 0, 0, 1, Y), w
    return applies


# ---------------------------------------------------------------- the words


PHASES = [("wait", "slot", "itself"), ("wait", "slot", "parent"),
          ("wait", "writing", "itself"), ("wait", "writing", "parent"),
          ("drop", "ticket", "itself"), ("drop", "ticket", "parent"),
          ("drop", "slot", "parent"), ("drop", "writing", "itself"),
          ("drop", "writing", "parent")]


@pytest.mark.parametrize("order", ["left-first", "left-last"])
@pytest.mark.parametrize(("policy", "phase", "by"), PHASES)
def test_a_step_given_back_in_each_phase(policy, phase, by, order):
    """Worker a reads, worker b holds a step in `phase` and gives it back
    (by itself, as Step.__exit__ does, or by the parent once b is dead)
    before or after a's write. Then: b holds nothing, its `left` counts 1,
    no ticket is outstanding, a slot b held was filled by an empty update
    counted in V (and not handed out again), a write b had begun was finished
    (its ticket settled), and interval 0 opens after exactly y applies."""
    gate = it.IntervalGate(Y, policy=policy, workers=4)
    a, b = Worker(gate), Worker(gate)
    a.begin()
    held = b.hold(phase)
    filled = phase != "ticket"  # b's slot counts in the interval's y
    if order == "left-last":
        assert a.start_write() >= 0
        a.end_write()
    a_phase = a.phase
    before = words(gate)
    if by == "itself":
        assert b.give_back() == held
    else:
        assert gate.give_back(b.pid) == 1
    assert b.phase == S.IDLE and b.left == 1 and a.left == 0
    assert a.phase == a_phase  # the parent gave back b's row only
    after = words(gate)
    assert after["V"] == before["V"] + (phase == "slot")  # the empty update
    assert after["taken"] == before["taken"]  # b's slot is not handed out again
    assert after["applied"] == before["applied"] + filled
    if order == "left-first":
        assert a.start_write() >= 0
        a.end_write()
    w = words(gate)
    assert outstanding(gate) == 0 and w["active"] == 0, w
    assert (w["gen"], w["V"], w["applied"], w["taken"]) == (0, 1 + filled, 1 + filled,
                                                             1 + filled), w
    # the parent's give_back once b's process is gone: nothing more to return
    assert gate.give_back(b.pid) == 0 and words(gate) == w and b.left == 1
    assert open_by_applying(gate, a) == Y - 1 - filled
    report = gate.report()
    assert report.left == 1 and report.applied == Y - filled and report.dropped == 0
    assert report.bound_violations == 0 and report.staleness_max <= Y - 1
    assert report.intervals == 1 and outstanding(gate) == 0


def _sleep_for_a_slot(gate) -> None:
    worker = Worker(gate, pid=os.getpid())
    S.begin(gate.state, worker.row, gate.control, gate.code, gate.wait)  # sleeps: no slot
    os._exit(3)  # only if the gate stopped


def test_a_worker_killed_asleep_for_a_slot_gets_its_ticket_back():
    """Wait policy: a process asleep for a slot holds a ticket (its record
    says TICKET); killed there, the parent returns the ticket, which another
    worker then takes: a run of max_updates still completes every one."""
    y = 2
    gate = it.IntervalGate(y, workers=4, max_updates=3)
    a, b = Worker(gate), Worker(gate)
    a.begin()
    b.begin()  # interval 0 full
    child = multiprocessing.get_context("fork").Process(target=_sleep_for_a_slot, args=(gate,))
    child.start()
    try:
        deadline = time.monotonic() + 60  # a hang bound, not a timing
        while not (int(gate.control[S.NEXT_ROW]) == 3 and gate.rows[2, S.PID] == child.pid
                   and gate.rows[2, S.PHASE] == S.TICKET and gate.state[G.TICKETS] == 3):
            assert child.is_alive(), f"the sleeper left: exit code {child.exitcode}"
            assert time.monotonic() < deadline, f"no sleeper holding a ticket: {words(gate)}"
            time.sleep(0.01)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
    assert child.exitcode == -signal.SIGKILL
    assert gate.give_back(child.pid) == 1
    assert gate.rows[2, S.LEFT] == 1 and gate.rows[2, S.PHASE] == S.IDLE
    w = words(gate)
    assert (w["tickets"], w["taken"], w["V"]) == (2, 2, 0), w  # no slot, nothing counted
    for worker in (a, b):
        assert worker.start_write() >= 0
        worker.end_write()
    w = words(gate)
    assert (w["gen"], w["intervals"], w["V"], w["done"]) == (1, 1, y, 2), w
    a.step()  # the ticket given back
    assert gate.stopped and gate.status == "completed"
    report = gate.report()
    assert (report.applied, report.left, report.intervals) == (3, 1, 1)


# -------------------------------------------------------------- the Step API


class LeftError(Exception):
    """Raised by the user's code inside a step."""


def _raise():
    raise LeftError("the user's code")


def leave(gate, how: str) -> None:
    """One step of this process that ends without its write, `how`."""
    if how == "raise":
        with pytest.raises(LeftError), gate.step():
            _raise()
    elif how == "break":
        for _ in range(2):
            with gate.step():
                break
    elif how == "return":
        def early():
            with gate.step():
                return
        early()
    elif how == "raise-in-write":
        with pytest.raises(LeftError), gate.step() as step:
            step.apply(_raise)
    elif how == "raise-in-read":
        with pytest.raises(LeftError), gate.step(read=_raise):
            pytest.fail("the block ran although the read raised")
    else:  # pragma: no cover
        raise AssertionError(how)


HOWS = ["raise", "break", "return", "raise-in-write", "raise-in-read"]


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("policy", ["wait", "drop"])
def test_leaving_the_block_without_apply_gives_the_step_back(policy, how):
    """The Step API, as a user writes it, in this process: after the step is
    left, its row holds nothing and counts it in `left`, no ticket is
    outstanding, a slot it held (wait policy, or drop once committed) counts
    in the interval, which opens after exactly y applies."""
    gate = it.IntervalGate(Y, policy=policy, workers=2)
    leave(gate, how)
    r = gate._row()
    filled = policy == "wait" or how == "raise-in-write"
    w = words(gate)
    assert gate.rows[r, S.PHASE] == S.IDLE and gate.rows[r, S.LEFT] == 1, (how, w)
    assert outstanding(gate) == 0 and w["active"] == 0, w
    assert (w["gen"], w["V"], w["applied"], w["taken"]) == (0, filled, filled, filled), w
    assert gate.give_back(os.getpid()) == 0  # the parent's, once the process is gone
    assert open_by_applying(gate) == Y - filled
    report = gate.report()
    assert report.left == 1 and report.applied == Y - filled
    assert report.computed == report.applied + (how == "raise-in-write")


def test_a_read_that_raises_releases_async_lock_and_ticket():
    gate = it.AsyncGate(workers=2, max_updates=2)
    leave(gate, "raise-in-read")
    assert gate.state[G.LOCK] == 0 and outstanding(gate) == 0
    assert gate.report().left == 1
    for _ in range(2):
        assert gate.state[G.LOCK] == 0, "async's lock is held: the next step would spin"
        with gate.step() as step:
            step.apply()
    assert gate.stopped and gate.report().applied == 2


@pytest.mark.parametrize("policy", ["wait", "drop"])
def test_max_updates_completes_every_update_around_left_steps(policy):
    """max_updates = 6 at y = 2, with steps left by raise, break, return and
    a dead worker's step given back between the applies: all 6 are applied,
    then the gate stops (Stopped), `left` counts the 4, V the empty updates."""
    y, limit = 2, 6
    gate = it.IntervalGate(y, policy=policy, workers=3, max_updates=limit)
    dead = Worker(gate)
    applied = left = 0
    plan = ["apply", "raise", "apply", "break", "dead", "apply", "return"]
    for n in range(50):
        what = plan[n] if n < len(plan) else "apply"
        w = words(gate)
        assert w["tickets"] < limit, f"no ticket left after {applied} applies: {w}"
        if gate.wait:
            assert w["taken"] < y, f"every slot taken, the interval never opens: {w}"
        if what == "apply":
            with gate.step() as step:
                assert step.apply()
            applied += 1
        elif what == "dead":
            dead.begin()
            assert gate.give_back(dead.pid) == 1
            left += 1
        else:
            leave(gate, what)
            left += 1
        if gate.stopped:
            break
    assert applied == limit and left == 4
    with pytest.raises(it.Stopped):
        gate.step().__enter__()
    report = gate.report()
    assert report.status == "completed"
    assert (report.applied, report.left, report.computed, report.dropped) == (limit, 4, limit, 0)
    v = limit + (4 if policy == "wait" else 0)  # wait: each left step's slot, filled
    w = words(gate)
    assert (w["V"], w["intervals"], w["applied"], w["done"]) == (v, v // y, v % y, limit), w
    assert outstanding(gate) == 0 and report.bound_violations == 0


@pytest.mark.parametrize("policy", ["wait", "drop"])
def test_a_write_given_back_completes_the_run(policy):
    """A dead worker's write in progress is finished for it: it settles its
    ticket, so when it is the last of max_updates the run completes (stops)."""
    gate = it.IntervalGate(2, policy=policy, workers=2, max_updates=2)
    Worker(gate).step()
    dead = Worker(gate)
    dead.hold("writing")
    assert not gate.stopped
    assert gate.give_back(dead.pid) == 1
    assert gate.stopped and gate.status == "completed"
    w = words(gate)
    assert (w["gen"], w["V"], w["done"], w["tickets"]) == (1, 2, 2, 2), w
    report = gate.report()
    assert (report.applied, report.left, report.intervals) == (1, 1, 1)


# ------------------------------------------------------------ real processes


PROCESSES = 3
MAX_UPDATES = 240
RUN_BOUND_S = 60  # a run of a few hundred tiny updates takes a second or two
LEAVE_FIRST = 10  # rank 0 leaves this many steps before the others start


def wait_until(gate, done, what: str) -> None:
    """A worker's wait, bounded: it ends when the gate stops, and raises
    (the report lists it) after RUN_BOUND_S."""
    deadline = time.monotonic() + RUN_BOUND_S
    while not done() and not gate.stopped:
        if time.monotonic() > deadline:
            raise RuntimeError(f"waited {RUN_BOUND_S} s for {what}")
        time.sleep(0.001)


def leaving_worker(rank, model, gate, applied, left):
    """Every process trains a tiny shared model; rank 0 leaves two steps of
    every three without applying: by an exception it catches, by break, by
    return. applied[rank], left[rank]: its own counts. However the processes
    get the cores, all take part: the others start once rank 0 has left
    LEAVE_FIRST steps, and rank 0 goes on once each of them has applied one."""
    if rank != 0:
        wait_until(gate, lambda: left[0].item() >= LEAVE_FIRST, "rank 0's first steps")
    torch.manual_seed(rank)
    x = torch.randn(8, 4)

    def write():  # plain SGD (torch.optim's first optimiser imports for seconds)
        with torch.no_grad():
            for p in model.parameters():
                p.sub_(0.01 * p.grad)
        applied[rank] += 1

    def compute():
        model.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        return loss

    def returns_early():
        with gate.step():
            compute()
            return

    n = 0
    while True:
        n += 1
        if rank == 0 and left[0].item() == LEAVE_FIRST:
            wait_until(gate, lambda: applied[1:].min().item() > 0, "the others' first updates")
        how = n % 3 if rank == 0 else 0
        if how == 1:
            try:
                with gate.step():
                    compute()
                    raise LeftError("caught by the worker")
            except LeftError:
                left[rank] += 1
        elif how == 2:
            if n % 2:
                for _ in range(3):
                    with gate.step():
                        compute()
                        break
            else:
                returns_early()
            left[rank] += 1
        else:
            with gate.step() as step:
                loss = compute()
                step.apply(write, loss=loss)


def run_bounded(gate, fn, args, processes, seconds):
    """gate.run, but a run that has not ended after `seconds` is stopped
    (its status then says so), and its workers terminated 10 s later."""
    ended = threading.Event()

    def watch():
        if ended.wait(seconds):
            return
        gate.stop()
        if not ended.wait(10):
            for child in multiprocessing.active_children():
                child.terminate()

    watchdog = threading.Thread(target=watch, daemon=True)
    watchdog.start()
    try:
        return gate.run(fn, args=args, processes=processes, start_method="fork",
                        on_error="continue")
    finally:
        ended.set()
        watchdog.join()


@pytest.mark.timeout(120)
def test_a_worker_that_keeps_leaving_lets_the_run_complete():
    """Wait policy, max_updates: rank 0 gives back two steps of every three
    (caught exception, break, return) while the others go on. The run
    completes with every update applied; `left` is the steps given back, V
    counts their empty updates, and the report's figures agree with the
    workers' own counts and the gate's words."""
    model = torch.nn.Linear(4, 1)
    model.share_memory()
    y = 4
    gate = it.IntervalGate(y, workers=PROCESSES, max_updates=MAX_UPDATES)
    gate.warm()
    applied = torch.zeros(PROCESSES, dtype=torch.int64).share_memory_()
    left = torch.zeros(PROCESSES, dtype=torch.int64).share_memory_()
    report = run_bounded(gate, leaving_worker, (model, gate, applied, left), PROCESSES,
                         RUN_BOUND_S)
    assert report.status == "completed", (
        f"the run did not complete within {RUN_BOUND_S} s (stopped): {report.line()}; "
        f"words {words(gate)}")
    assert report.failures == [], report.failures
    assert report.applied == MAX_UPDATES == applied.sum().item()
    assert left[0].item() >= LEAVE_FIRST and left[1:].sum().item() == 0
    assert report.left == left.sum().item() == int(gate.rows[:PROCESSES, S.LEFT].sum())
    assert report.computed == report.applied and report.dropped == 0
    assert int(report.staleness_hist.sum()) == report.applied
    assert report.bound_violations == 0 and report.staleness_max <= y - 1
    assert report.workers == PROCESSES and applied.min().item() > 0
    w = words(gate)
    assert w["V"] == report.applied + report.left  # each left step's slot, filled
    assert (w["intervals"], w["applied"]) == (w["V"] // y, w["V"] % y) == (report.intervals,
                                                                          w["applied"])
    assert w["done"] == w["tickets"] == MAX_UPDATES and w["active"] == 0
    assert torch.isfinite(model.weight).all()
