"""The compiled calls a PyTorch step makes into the gate (no torch here).

A step of iasgd.torch is three calls from Python around the user's code,
each a compiled function that runs iasgd.protocol.gate's own (inlined)
functions in the order iasgd.protocol.workers.async_worker makes them:

    gen = begin(...)        acquire_ticket, enter_interval (wait policy: a
                            slot), read_version; async: the lock for the read
    (end_read(...))         async: the read is done, unlock
    ... the user's forward and backward ...
    tau = start_write(...)  commit_step (drop policy: claim a slot, or drop
                            and give the ticket back); begin_apply; async: lock
    ... the user's optimiser writes the shared parameters ...
    end_write(...)          the run-time check of the bound, finish_apply
                            (interval: the y-th apply opens the next one) or
                            async's unlock, record, settle

What a worker holds between the calls is written to its row of a shared
int64 array (PHASE, with GEN, V_READ, TAU and LOCKED) right after the gate
call that changes it, so that `give_back` can return it for a step that
ends without its write: one that raises, leaves its `with` block without
applying, or whose process dies (the parent calls give_back then):

    TICKET   a ticket (and, drop policy, the generation read): returned
    SLOT     a slot of interval GEN as well: the interval is closed for it
             with an empty update (V counts it, nothing is written), the
             ticket returned, so the interval completes with y applies
    WRITING  counted in V, partly written: finish_apply and settle (the
             update stays as far as it got, as a Hogwild! write may)
    WRITTEN  settle
    LOCKED   async's lock, held: released

A process killed between a gate call and the store of its phase (a window
of a few instructions inside compiled code, never while Python or the
user's code runs) leaves that one step unrecorded; see docs/pytorch.md.

Rows have ROW columns: iasgd.protocol.workers' counter columns first
(COMPUTED .. SLICES; so iasgd.results.summarize reads them), then the step's
record. `control` holds W's probe slots (ACTIVE, ACTIVE_MAX, LOSS_POS), the
next free row and the stop reason.
"""

from __future__ import annotations

import numpy as np

from iasgd.compiled import jit
from iasgd.protocol import gate as G
from iasgd.protocol import workers as W
from iasgd.protocol.atomics import atomic_add, atomic_cas, atomic_load, atomic_store, monotonic_ns

# the algorithms (iasgd.protocol.workers' codes)
HOGWILD, ASYNC, INTERVAL = W.HOGWILD, W.ASYNC, W.INTERVAL

# a row: W's counter columns 0 .. W.COUNTER_COLUMNS - 1, then these
PHASE = W.COUNTER_COLUMNS  # what the step in flight holds (below)
GEN = PHASE + 1  # the interval it reads in
V_READ = PHASE + 2  # V at its read
TAU = PHASE + 3  # its staleness, once counted
LOCKED = PHASE + 4  # 1 while it holds async's lock
PID = PHASE + 5  # the process that owns the row
LEFT = PHASE + 6  # steps given back without their write (raised, left, died)
ROW = 32
IDLE, TICKET, SLOT, WRITING, WRITTEN = range(5)

# control: W's probe slots, then
NEXT_ROW = 8  # rows claimed so far
REASON = 9  # why the run stopped: one of REASONS' indices (0: it runs)
CONTROL = 16
# the statuses of iasgd.results.Status where they apply, and two of the gate's own
REASONS = ("running", "completed", "stopped", "failed", "interrupted", "time_budget")
RUNNING, COMPLETED, STOPPED, FAILED, INTERRUPTED, TIME_BUDGET = range(len(REASONS))


@jit
def claim_row(control, rows):
    """A free row for a new worker: its index, or -1 if every row is taken."""
    r = atomic_add(control, NEXT_ROW, 1)
    return r if r < rows else -1


@jit
def begin(state, row, control, algo, wait):
    """Ticket, slot (wait policy) and V at the read. Returns the generation
    read in (>= 0), or -1 if the run stopped (nothing is held then). async
    holds its lock on return: call end_read after reading."""
    t0 = monotonic_ns()
    if not G.acquire_ticket(state, 0):
        return -1
    atomic_store(row, PHASE, TICKET)
    gen = G.enter_interval(state, wait)  # on -1 it has given the ticket back
    row[W.WAIT_NS] += monotonic_ns() - t0
    if gen < 0:
        atomic_store(row, PHASE, IDLE)
        return -1
    atomic_store(row, GEN, gen)
    if wait:
        atomic_store(row, PHASE, SLOT)
    if algo == ASYNC:
        G.lock(state)
        atomic_store(row, LOCKED, 1)
    atomic_store(row, V_READ, G.read_version(state))
    now = atomic_add(control, W.ACTIVE, 1) + 1
    while True:  # control[ACTIVE_MAX] = max(control[ACTIVE_MAX], now)
        seen = atomic_load(control, W.ACTIVE_MAX)
        if now <= seen or atomic_cas(control, W.ACTIVE_MAX, seen, now) == seen:
            break
    return gen


@jit
def end_read(state, row):
    """async: the consistent read is done; release the lock."""
    if atomic_load(row, LOCKED) != 0:
        atomic_store(row, LOCKED, 0)
        G.unlock(state)


@jit
def start_write(state, row, control, algo, drop):
    """After computing: commit (drop policy: claim a slot of the interval
    read in), count the update in V. Returns its staleness tau, or -1 if
    the drop gate dropped it (its ticket is given back)."""
    row[W.COMPUTED] += 1
    if not G.commit_step(state, atomic_load(row, GEN), drop):
        row[W.DROPPED] += 1
        atomic_add(control, W.ACTIVE, -1)
        G.return_ticket(state)
        atomic_store(row, PHASE, IDLE)
        return -1
    atomic_store(row, PHASE, SLOT)
    if algo == ASYNC:
        G.lock(state)
        atomic_store(row, LOCKED, 1)
    tau = G.begin_apply(state) - atomic_load(row, V_READ)
    atomic_store(row, TAU, tau)
    atomic_store(row, PHASE, WRITING)
    return tau


@jit
def end_write(state, row, hist, control, ring, algo, loss):
    """The update is written: check the bound (interval: applied in the
    interval read in, tau <= y - 1, else counted in VIOLATIONS, as the
    engine's workers do), close the interval or release async's lock,
    record tau (and the loss, unless NaN), settle. Returns True if this
    update was the last one the gate allows (the run then stops)."""
    tau = atomic_load(row, TAU)
    if algo == INTERVAL:
        if G.crossed(state, atomic_load(row, GEN)) or tau > atomic_load(state, G.Y) - 1:
            row[W.VIOLATIONS] += 1
        G.finish_apply(state)
    elif algo == ASYNC:
        atomic_store(row, LOCKED, 0)
        G.unlock(state)
    atomic_store(row, PHASE, WRITTEN)
    row[W.APPLIED] += 1
    row[W.TAU_SUM] += tau
    row[W.TAU_MAX] = max(row[W.TAU_MAX], tau)
    hist[min(tau, hist.size - 1)] += 1
    if not np.isnan(loss):
        ring[atomic_add(control, W.LOSS_POS, 1) % ring.size] = loss
    atomic_add(control, W.ACTIVE, -1)
    G.settle(state)
    atomic_store(row, PHASE, IDLE)
    if atomic_load(state, G.DONE) >= atomic_load(state, G.LIMIT):
        atomic_cas(control, REASON, RUNNING, COMPLETED)
        G.request_stop(state)
        return True
    return False


@jit
def give_back(state, row, control, algo):
    """Return what the step recorded in `row` holds (the module doc): for a
    step that ended without its write, in its own process or, once that
    process is dead, in the parent. Returns the phase it was in (IDLE:
    nothing held)."""
    phase = atomic_load(row, PHASE)
    if atomic_load(row, LOCKED) != 0:
        atomic_store(row, LOCKED, 0)
        G.unlock(state)
    if phase == IDLE:
        return phase
    if phase == SLOT and algo == INTERVAL:
        G.begin_apply(state)  # an empty update fills the slot
        G.finish_apply(state)
    if phase < WRITING:  # TICKET or SLOT
        G.return_ticket(state)
    elif phase == WRITING:
        if algo == INTERVAL:
            G.finish_apply(state)
        G.settle(state)
    elif phase == WRITTEN:
        G.settle(state)
    if phase != WRITTEN:
        atomic_add(control, W.ACTIVE, -1)
        row[LEFT] += 1
    atomic_store(row, PHASE, IDLE)
    if atomic_load(state, G.DONE) >= atomic_load(state, G.LIMIT):
        atomic_cas(control, REASON, RUNNING, COMPLETED)
        G.request_stop(state)
    return phase


@jit
def stop(state, control, reason):
    """Stop the run (the first reason given is kept): every worker leaves
    at its next begin, sleepers wake."""
    atomic_cas(control, REASON, RUNNING, reason)
    G.request_stop(state)


@jit
def wait_finished(state, timeout_us):
    """The parent: sleep until the allowed updates are all written or the
    run stops (True), or at most timeout_us (False)."""
    return G.wait_settled(state, timeout_us)
