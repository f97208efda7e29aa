"""The protocol every parallel step follows, on one int64 state array: update
tickets, the interval gate of Interval-Asynchrony, parking (the adaptive
thread count), the lock of lock-based async and the rounds of sync. Every
function is compiled (nogil) and uses atomics only, so worker threads call it
from their compiled loop while the main thread reads or steers the same array.
The same source also runs step by step under tests/protocol/gate_model.py, which
explores the interleavings of its atomic operations.

One step of async, hogwild or interval (iasgd.protocol.workers.async_worker):

    acquire_ticket(state, wid)             park while wid >= M; stop if past the
                                           deadline; take a ticket (sleep while
                                           none is allowed)
    gen = enter_interval(state, wait)      wait policy: take a slot of the open
                                           interval (sleep while all y are taken)
    v_read = read_version(state)           then read the parameters, compute
    commit_step(state, gen, drop)          drop policy: claim a slot of interval
                                           gen, or drop (return_ticket)
    tau = begin_apply(state) - v_read      then write the update
    finish_apply(state)                    interval: the y-th apply opens the next
    settle(state)                          the update is written and recorded

Intervals. Training is cut into intervals of exactly y applied updates; a
gradient is read and applied inside one interval, so tau <= y - 1. The
interval's word GEN_TAKEN holds (generation << 32) | slots taken. Nobody gets a
slot once `taken` reaches Y; the apply that completes the y-th update first
marks the word CLOSED (taken >= any y), then writes the next Y from Y_NEXT,
then publishes the next generation with no slot taken. The order matters: a
larger Y written while the old word was still open would let a late slot into
the closed interval.

Tickets. Each applied update needs a ticket; the main thread allows LIMIT of
them (an epoch's worth at a time) and the epoch ends when DONE, the updates
written and recorded, reaches LIMIT. A dropped update gives its ticket back.

Sleeping. A waiter announces itself (a sleeper count), reads the futex word,
re-checks its condition and only then sleeps; a waker changes the condition,
bumps the word, then wakes if anyone announced. With sequentially consistent
atomics one of the two always sees the other, so no wake-up is lost; the
futex timeouts are a safety net, never needed for progress. Threads of one
process sleep on private futexes; a state that processes share (SHARED set,
iasgd.torch) on shared ones, whose wakes reach every process.
"""

from __future__ import annotations

import numpy as np

from iasgd.compiled import jit_inline
from iasgd.protocol.atomics import (
    atomic_add,
    atomic_cas,
    atomic_load,
    atomic_store,
    cpu_relax,
    futex_wait,
    futex_wait_shared,
    futex_wake_all,
    futex_wake_all_shared,
    monotonic_ns,
    sleep_us,
)

# Slots of the state array.
GEN_TAKEN = 0  # (generation << 32) | slots taken in the current interval
APPLIED = 1  # updates applied in the current interval
VERSION = 2  # V: updates begun to be applied since the start of the run
Y = 3  # size of the current interval
Y_NEXT = 4  # size the next interval opens with (a controller may change it)
TICKETS = 5  # tickets handed out so far
LIMIT = 6  # tickets allowed so far (the end of the current epoch or eval_every chunk)
STOP = 7  # nonzero: every worker leaves at its next check
INTERVALS = 8  # intervals completed
LOCK = 9  # spin lock of the lock-based async algorithm
BARRIER_COUNT = 10  # sense-reversing barrier of sync
BARRIER_SENSE = 11
OPENED = 12  # futex word: bumped when an interval opens or the run stops
SLEEPERS = 13  # workers asleep on OPENED
M = 14  # workers allowed to run (the adaptive thread count); the others park
M_CHANGED = 15  # futex word: bumped when M changes or the run stops
DIVERGED = 16  # nonzero: a worker met a non-finite loss (the run stops)
Y_MAX = 17  # the largest y an interval has opened with
DONE = 18  # updates written and recorded since the start of the run
ALLOWANCE = 19  # futex word: bumped when tickets become available or the run stops
ALLOWANCE_SLEEPERS = 20  # workers asleep on ALLOWANCE
SETTLED = 21  # futex word: bumped when DONE reaches LIMIT or the run stops
ABORT = 22  # nonzero: a worker failed; barrier waiters leave as well
ROUND = 23  # sync: 1 if the current round's update is applied, 0 if cancelled
DEADLINE = 24  # monotonic ns at which the time budget runs out (0: none)
EXPIRED = 25  # nonzero: a worker found the deadline passed and stopped the run
SHARED = 26  # nonzero: the state is in memory that processes share (shared futexes)
STATE_SIZE = 32

DROP, WAIT = 0, 1
UNBOUNDED = 1 << 31  # y of an algorithm without intervals (never closes one)
CLOSED = 1 << 31  # `taken` of a closing interval: at least any y
MAX_Y = (1 << 31) - 1
_LOW32 = (1 << 32) - 1
SAFETY_US = 10_000  # futex timeout: a safety net only (see the module doc)
# A parked worker's safety net: it may sleep for the whole run (the cores
# schedule parks the surplus for good), and 126 parked threads waking every
# 10 ms cost the 2 that compute 12 % of their throughput on 2 cores.
PARKED_SAFETY_US = 1_000_000
SPIN_ROUNDS = 64  # a waiter spins this often before it sleeps (the model uses fewer)


def new_state(y: int = UNBOUNDED, limit: int = 0, active: int = 1 << 30,
              shared: bool = False) -> np.ndarray:
    """A fresh gate: generation 0, interval size y, `limit` tickets, `active`
    workers allowed to run. `shared`: its sleeps and wakes reach other
    processes (copy it into memory they share, e.g. iasgd.torch's)."""
    if not (1 <= y <= MAX_Y or y == UNBOUNDED):
        raise ValueError(f"interval size y must be in [1, {MAX_Y}], got {y}")
    state = np.zeros(STATE_SIZE, np.int64)
    state[Y] = state[Y_NEXT] = state[Y_MAX] = y
    state[LIMIT] = limit
    state[M] = active
    state[ROUND] = 1
    state[SHARED] = int(shared)
    return state


@jit_inline
def stopped(state):
    return atomic_load(state, STOP) != 0


@jit_inline
def _sleep(state, word, seen, timeout_us):
    """futex_wait on a word of the state, in the state's flavour: a private
    futex (threads of one process, cheaper) or, for a state that processes
    share, a shared one (a private wake would reach no other process)."""
    if atomic_load(state, SHARED) != 0:
        futex_wait_shared(state, word, seen, timeout_us)
    else:
        futex_wait(state, word, seen, timeout_us)


@jit_inline
def _wake(state, word):
    """futex_wake_all on a word of the state, in the state's flavour."""
    if atomic_load(state, SHARED) != 0:
        futex_wake_all_shared(state, word)
    else:
        futex_wake_all(state, word)


@jit_inline
def _bump_and_wake(state, word):
    atomic_add(state, word, 1)
    _wake(state, word)


@jit_inline
def request_stop(state):
    """Every worker leaves at its next check; sleepers of every kind wake."""
    atomic_store(state, STOP, 1)
    _bump_and_wake(state, OPENED)
    _bump_and_wake(state, M_CHANGED)
    _bump_and_wake(state, ALLOWANCE)
    _bump_and_wake(state, SETTLED)


@jit_inline
def mark_diverged(state):
    atomic_store(state, DIVERGED, 1)
    request_stop(state)


@jit_inline
def abort(state):
    """A worker failed: stop, and release the others from sync's barriers."""
    atomic_store(state, ABORT, 1)
    request_stop(state)


@jit_inline
def backoff(spins):
    """Wait a little: spin for the first rounds, then give the core away."""
    if spins < SPIN_ROUNDS:
        cpu_relax()
    elif spins < 4 * SPIN_ROUNDS:
        sleep_us(0)
    else:
        sleep_us(50)


# ------------------------------------------------------------------ tickets


@jit_inline
def take_ticket(state):
    """Reserve one update of the allowance; False when none is left or the
    run is stopping."""
    while True:
        t = atomic_load(state, TICKETS)
        if t >= atomic_load(state, LIMIT) or stopped(state):
            return False
        if atomic_cas(state, TICKETS, t, t + 1) == t:
            return True


@jit_inline
def _wake_allowance_sleepers(state):
    atomic_add(state, ALLOWANCE, 1)
    if atomic_load(state, ALLOWANCE_SLEEPERS) > 0:
        _wake(state, ALLOWANCE)


@jit_inline
def return_ticket(state):
    """Give a ticket back (a dropped update): a sleeping worker may take it."""
    atomic_add(state, TICKETS, -1)
    _wake_allowance_sleepers(state)


@jit_inline
def allow(state, limit):
    """Main thread: let the workers apply updates until `limit` in all (the
    next epoch). Never called after a stop."""
    atomic_store(state, LIMIT, limit)
    _wake_allowance_sleepers(state)


@jit_inline
def _no_allowance(state, have):
    if have < 0:
        have = atomic_load(state, TICKETS)
    return have >= atomic_load(state, LIMIT) and not stopped(state)


@jit_inline
def wait_for_allowance(state, have):
    """Sleep while nothing is allowed: while `have` (or, if negative, the
    tickets handed out) is at LIMIT, until LIMIT is raised, a ticket comes
    back or the run stops. Callers re-check: the return is no promise."""
    atomic_add(state, ALLOWANCE_SLEEPERS, 1)
    seen = atomic_load(state, ALLOWANCE)
    if _no_allowance(state, have):
        _sleep(state, ALLOWANCE, seen, SAFETY_US)
    atomic_add(state, ALLOWANCE_SLEEPERS, -1)


@jit_inline
def settle(state):
    """The update is written and recorded. The one that completes the
    allowance wakes the main thread."""
    if atomic_add(state, DONE, 1) + 1 >= atomic_load(state, LIMIT):
        _bump_and_wake(state, SETTLED)


@jit_inline
def settle_many(state, count):
    """settle for `count` updates at once (a sync round)."""
    if atomic_add(state, DONE, count) + count >= atomic_load(state, LIMIT):
        _bump_and_wake(state, SETTLED)


@jit_inline
def settled(state):
    return atomic_load(state, DONE) >= atomic_load(state, LIMIT) or stopped(state)


@jit_inline
def wait_settled(state, timeout_us):
    """Main thread: sleep until every allowed update is written and recorded
    or the run stops (True), or for at most timeout_us (False)."""
    deadline = monotonic_ns() + timeout_us * 1000
    while True:
        seen = atomic_load(state, SETTLED)
        if settled(state):
            return True
        left_ns = deadline - monotonic_ns()
        if left_ns <= 0:
            return False
        _sleep(state, SETTLED, seen, max(left_ns // 1000, 1))


# ---------------------------------------------------------------- intervals


@jit_inline
def generation(state):
    return atomic_load(state, GEN_TAKEN) >> 32


@jit_inline
def slots_left(state):
    """Slots of the current interval not taken yet (0 while it closes)."""
    return max(atomic_load(state, Y) - (atomic_load(state, GEN_TAKEN) & _LOW32), 0)


@jit_inline
def try_slot(state):
    """wait policy: take a slot of the current interval if one is free.
    Returns its generation, or -1 if all y are taken (or it is closing)."""
    while True:
        word = atomic_load(state, GEN_TAKEN)
        if (word & _LOW32) >= atomic_load(state, Y):
            return -1
        if atomic_cas(state, GEN_TAKEN, word, word + 1) == word:
            return word >> 32


@jit_inline
def wait_for_slot(state):
    """wait policy: take a slot, waiting for the next interval while all are
    taken. Returns the generation, or -1 if the run was stopped.

    A waiter spins briefly, then sleeps on a futex until the interval opens:
    polling threads would steal the cores from the workers still computing
    (with more threads than cores, a sleep-and-poll loop cost half the
    throughput)."""
    spins = 0
    while True:
        gen = try_slot(state)
        if gen >= 0:
            return gen
        if stopped(state):
            return -1
        if spins < SPIN_ROUNDS:
            cpu_relax()
            spins += 1
            continue
        atomic_add(state, SLEEPERS, 1)
        seen = atomic_load(state, OPENED)
        # Re-check after announcing ourselves: an interval that opened before
        # `seen` was read is visible to try_slot now; one that opens later
        # changes OPENED, so the futex does not sleep or is woken.
        gen = try_slot(state)
        if gen < 0 and not stopped(state):
            _sleep(state, OPENED, seen, SAFETY_US)
        atomic_add(state, SLEEPERS, -1)
        if gen >= 0:
            return gen


@jit_inline
def claim_slot(state, gen):
    """drop policy, at commit: take a slot if interval `gen` is still open and
    has one free. False means the update must be dropped."""
    while True:
        word = atomic_load(state, GEN_TAKEN)
        if (word >> 32) != gen or (word & _LOW32) >= atomic_load(state, Y):
            return False
        if atomic_cas(state, GEN_TAKEN, word, word + 1) == word:
            return True


@jit_inline
def begin_apply(state):
    """Count one update as applied to the parameters: returns V just before
    it (the update's staleness is this minus V at its read)."""
    return atomic_add(state, VERSION, 1)


@jit_inline
def finish_apply(state):
    """Call after the update is written. The apply that completes an interval
    opens the next one (with y from Y_NEXT). Returns True if it did."""
    # y before the count: once this update is counted, the interval may be
    # completed by another apply and Y rewritten for the next one
    y = atomic_load(state, Y)
    if atomic_add(state, APPLIED, 1) + 1 < y:
        return False
    # All y slots are taken and applied: only this thread touches the
    # interval now. Close it before Y changes (see the module doc).
    gen = atomic_load(state, GEN_TAKEN) >> 32
    atomic_store(state, GEN_TAKEN, (gen << 32) | CLOSED)
    atomic_store(state, APPLIED, 0)
    y = atomic_load(state, Y_NEXT)
    atomic_store(state, Y, y)
    if y > atomic_load(state, Y_MAX):
        atomic_store(state, Y_MAX, y)
    atomic_add(state, INTERVALS, 1)
    atomic_store(state, GEN_TAKEN, (gen + 1) << 32)  # opens it
    atomic_add(state, OPENED, 1)
    if atomic_load(state, SLEEPERS) > 0:
        _wake(state, OPENED)
    return True


@jit_inline
def crossed(state, gen):
    """True if an update read in interval `gen` is about to be applied in
    another one (call between begin_apply and finish_apply; never true while
    the gate is correct)."""
    return generation(state) != gen


# ----------------------------------------------------------- one whole step


@jit_inline
def park_while_inactive(state, wid):
    """Sleep while worker `wid` is outside the active count M. False if the
    run stopped instead."""
    while wid >= atomic_load(state, M):
        if stopped(state):
            return False
        seen = atomic_load(state, M_CHANGED)
        if wid >= atomic_load(state, M) and not stopped(state):
            _sleep(state, M_CHANGED, seen, PARKED_SAFETY_US)
    return True


@jit_inline
def stop_if_past_deadline(state):
    """Stop the run if its time budget is spent (True). Workers check before
    every step, so a run stops on time however late the main thread gets a
    core."""
    deadline = atomic_load(state, DEADLINE)
    if deadline > 0 and monotonic_ns() >= deadline:
        atomic_store(state, EXPIRED, 1)
        request_stop(state)
        return True
    return False


@jit_inline
def acquire_ticket(state, wid):
    """The first thing a step does: park while inactive, then take a ticket,
    sleeping while none is allowed. False when the worker should leave (the
    run stopped)."""
    while True:
        if not park_while_inactive(state, wid):
            return False
        if stop_if_past_deadline(state):
            return False
        if take_ticket(state):
            return True
        if stopped(state):
            return False
        wait_for_allowance(state, -1)


@jit_inline
def enter_interval(state, wait):
    """After the ticket, before the read: the generation the step reads in.
    With the wait policy (`wait` true) take a slot, waiting while all are
    taken; -1 if the run stopped meanwhile (the ticket is given back)."""
    if not wait:
        return generation(state)
    gen = wait_for_slot(state)
    if gen < 0:
        return_ticket(state)
    return gen


@jit_inline
def read_version(state):
    """V at the step's read of the parameters."""
    return atomic_load(state, VERSION)


@jit_inline
def commit_step(state, gen, drop):
    """After computing: with the drop policy (`drop` true) claim a slot of
    interval `gen`. False means the update is dropped: the caller counts it,
    then gives its ticket back (return_ticket)."""
    return not drop or claim_slot(state, gen)


@jit_inline
def set_active(state, m):
    """Let workers 0 .. m-1 run; the others park at their next step."""
    atomic_store(state, M, m)
    _bump_and_wake(state, M_CHANGED)


# ----------------------------------------------------- lock and sync rounds


@jit_inline
def lock(state):
    spins = 0
    while atomic_cas(state, LOCK, 0, 1) != 0:
        backoff(spins)
        spins += 1


@jit_inline
def unlock(state):
    atomic_store(state, LOCK, 0)


@jit_inline
def sync_round_size(state, parties, done):
    """Gradients in the next sync round, the same for every party: each
    party counts the rounds' gradients in `done` alike. 0: wait for an
    allowance; -1: leave (the run stopped between rounds)."""
    left = atomic_load(state, LIMIT) - done
    if left > 0:
        return min(parties, left)
    if not stopped(state):
        return 0
    # LIMIT is final once STOP is set (allow is never called after a stop),
    # so every party that sees the stop reads the same LIMIT here.
    left = atomic_load(state, LIMIT) - done
    return min(parties, left) if left > 0 else -1


@jit_inline
def barrier(state, parties, sense):
    """Sense-reversing barrier for `parties` threads; `sense` is the caller's
    local sense (flip it before each barrier). Returns 1 if the round goes
    on, 0 if the last party to arrive saw a stop (every party gets the same
    answer, so a round is applied by all or by none), -1 if a worker failed."""
    if atomic_add(state, BARRIER_COUNT, 1) + 1 == parties:
        atomic_store(state, ROUND, 0 if stopped(state) else 1)
        atomic_store(state, BARRIER_COUNT, 0)
        atomic_store(state, BARRIER_SENSE, sense)
        return atomic_load(state, ROUND)
    spins = 0
    while atomic_load(state, BARRIER_SENSE) != sense:
        if atomic_load(state, ABORT) != 0:
            return -1
        backoff(spins)
        spins += 1
    return atomic_load(state, ROUND)
