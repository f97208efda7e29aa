"""The interval gate of Interval-Asynchrony, and the update tickets every
parallel algorithm uses. All state lives in one int64 array; every function is
compiled (nogil) and uses atomics only, so worker threads call it from their
compiled loop and a controller thread can read or steer it at any time.

Intervals. Training is cut into intervals of exactly `y` applied updates. A
gradient may not cross an interval boundary: it is read and applied inside the
same interval, so its staleness is at most y - 1. Two policies:

- drop: a worker starts whenever it likes and notes the generation (interval
  number) it read under; at commit the update is accepted only if that
  generation is still current and a slot is free, else it is thrown away.
- wait: a worker takes a slot before it reads the parameters (at most y starts
  per interval); if none is free it waits for the next interval.

Either way the next interval opens only when all y updates of the current one
have been *applied*: the worker whose apply completes the interval opens the
next one, with the y found in Y_NEXT (where a controller may have put a new
value).

Tickets. Each applied update needs a ticket; the run hands out exactly LIMIT
of them (an epoch's worth at a time), so epochs hold exactly ceil(N/b) applied
updates. A worker takes its ticket before its slot, and gives it back if its
update is dropped.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from iasgd.atomics import (
    atomic_add,
    atomic_cas,
    atomic_load,
    atomic_store,
    cpu_relax,
    futex_wait,
    futex_wake_all,
    sleep_us,
)

# Slots of the state array.
GEN_TAKEN = 0  # (generation << 32) | slots taken in the current interval
APPLIED = 1  # updates applied in the current interval
VERSION = 2  # V: updates applied since the start of the run
Y = 3  # size of the current interval
Y_NEXT = 4  # size the next interval opens with (a controller may change it)
TICKETS = 5  # tickets handed out so far
LIMIT = 6  # tickets available until the next pause
STOP = 7  # nonzero: every worker leaves at its next check
INTERVALS = 8  # intervals completed
LOCK = 9  # spin lock of the lock-based async algorithm
BARRIER_COUNT = 10  # sense-reversing barrier of sync
BARRIER_SENSE = 11
OPENED = 12  # bumped whenever an interval opens or the run stops: sleepers wake on it
SLEEPERS = 13  # workers asleep waiting for an interval to open
M = 14  # workers allowed to run (the adaptive thread count); the others park
M_CHANGED = 15  # bumped whenever M changes: parked workers wake on it
DIVERGED = 16  # nonzero: a worker met a non-finite loss (the run stops)
STATE_SIZE = 24

POLICIES = ("drop", "wait")
DROP, WAIT = 0, 1
UNBOUNDED = 1 << 31  # y of an algorithm without intervals (never closes one)
_LOW32 = (1 << 32) - 1

jit = nb.njit(nogil=True, cache=True)


def new_state(y: int = UNBOUNDED, limit: int = 0, active: int = 1 << 30) -> np.ndarray:
    """A fresh gate: generation 0, interval size y, `limit` tickets, `active`
    workers allowed to run."""
    if y < 1:
        raise ValueError(f"interval size y must be >= 1, got {y}")
    state = np.zeros(STATE_SIZE, np.int64)
    state[Y] = state[Y_NEXT] = y
    state[LIMIT] = limit
    state[M] = active
    return state


@jit
def stopped(state):
    return atomic_load(state, STOP) != 0


@jit
def request_stop(state):
    atomic_store(state, STOP, 1)
    _wake_sleepers(state)


@jit
def mark_diverged(state):
    atomic_store(state, DIVERGED, 1)
    request_stop(state)


@jit
def _wake_sleepers(state):
    atomic_add(state, OPENED, 1)
    if atomic_load(state, SLEEPERS) > 0:
        futex_wake_all(state, OPENED)


@jit
def backoff(spins):
    """Wait a little: spin for the first rounds, then give the core away."""
    if spins < 64:
        cpu_relax()
    elif spins < 256:
        sleep_us(0)
    else:
        sleep_us(50)


# ------------------------------------------------------------------ tickets


@jit
def take_ticket(state):
    """Reserve one update of the current allowance; False when none is left
    or the run is stopping."""
    while True:
        t = atomic_load(state, TICKETS)
        if t >= atomic_load(state, LIMIT) or stopped(state):
            return False
        if atomic_cas(state, TICKETS, t, t + 1) == t:
            return True


@jit
def return_ticket(state):
    atomic_add(state, TICKETS, -1)


# ---------------------------------------------------------------- intervals


@jit
def generation(state):
    return atomic_load(state, GEN_TAKEN) >> 32


@jit
def try_slot(state):
    """wait policy: take a slot of the current interval if one is free.
    Returns its generation, or -1 if all y are taken."""
    while True:
        word = atomic_load(state, GEN_TAKEN)
        if (word & _LOW32) >= atomic_load(state, Y):
            return -1
        if atomic_cas(state, GEN_TAKEN, word, word + 1) == word:
            return word >> 32


@jit
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
        if spins < 64:
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
            futex_wait(state, OPENED, seen, 10_000)  # 10 ms: a safety net only
        atomic_add(state, SLEEPERS, -1)
        if gen >= 0:
            return gen


@jit
def claim_slot(state, gen):
    """drop policy, at commit: take a slot if interval `gen` is still open and
    has one free. False means the update must be dropped."""
    while True:
        word = atomic_load(state, GEN_TAKEN)
        if (word >> 32) != gen or (word & _LOW32) >= atomic_load(state, Y):
            return False
        if atomic_cas(state, GEN_TAKEN, word, word + 1) == word:
            return True


@jit
def begin_apply(state):
    """Count one update as applied to the parameters: returns V just before
    it (the update's staleness is this minus V at its read)."""
    return atomic_add(state, VERSION, 1)


@jit
def finish_apply(state):
    """Call after the update is written. The apply that completes an interval
    opens the next one (with y from Y_NEXT). Returns True if it did."""
    done = atomic_add(state, APPLIED, 1) + 1
    if done < atomic_load(state, Y):
        return False
    # All y slots are taken and applied: nobody else touches the interval now.
    gen = atomic_load(state, GEN_TAKEN) >> 32
    atomic_store(state, APPLIED, 0)
    atomic_store(state, Y, atomic_load(state, Y_NEXT))
    atomic_add(state, INTERVALS, 1)
    atomic_store(state, GEN_TAKEN, (gen + 1) << 32)  # publishes the new interval
    _wake_sleepers(state)
    return True


# ------------------------------------------------- adaptive thread count


@jit
def set_active(state, m):
    """Let workers 0 .. m-1 run; the others park at their next step."""
    atomic_store(state, M, m)
    atomic_add(state, M_CHANGED, 1)
    futex_wake_all(state, M_CHANGED)


@jit
def park_while_inactive(state, wid):
    """Sleep (no spinning) while worker `wid` is not among the active ones.
    Returns False when the worker should leave instead: the run stops or the
    tickets of this epoch are gone."""
    while wid >= atomic_load(state, M):
        if stopped(state) or atomic_load(state, TICKETS) >= atomic_load(state, LIMIT):
            return False
        seen = atomic_load(state, M_CHANGED)
        if wid >= atomic_load(state, M):
            futex_wait(state, M_CHANGED, seen, 5_000)  # wakes on a change, or checks again
    return True


# ----------------------------------------------------- lock and barrier


@jit
def lock(state):
    spins = 0
    while atomic_cas(state, LOCK, 0, 1) != 0:
        backoff(spins)
        spins += 1


@jit
def unlock(state):
    atomic_store(state, LOCK, 0)


@jit
def barrier(state, parties, sense):
    """Sense-reversing barrier for `parties` threads; `sense` is the caller's
    local sense (flip it after each barrier). False if the run was stopped
    while waiting."""
    if atomic_add(state, BARRIER_COUNT, 1) + 1 == parties:
        atomic_store(state, BARRIER_COUNT, 0)
        atomic_store(state, BARRIER_SENSE, sense)
        return True
    spins = 0
    while atomic_load(state, BARRIER_SENSE) != sense:
        if stopped(state):
            return False
        backoff(spins)
        spins += 1
    return True
