"""What a step of each parallel algorithm does, compiled once, and the
worker loops that run the steps on real threads.

A step is four compiled calls that every executor makes in this order (the
threads here, iasgd.executors.simulated's simulated workers, a cluster's nodes):

    gate.acquire_ticket, gate.enter_interval   (iasgd.protocol.gate: ticket and slot)
    v_read = read_step(...)                    draw the batch, read V (and a snapshot)
    loss = compute_step(...)                   forward and backward
    apply_step(...)                            commit, apply, record, settle

A worker thread makes one call per run into `async_worker` or `sync_worker`,
which runs with the GIL released until the run is stopped, sleeping between
epochs. Python does nothing per step. The simulator makes the same calls, one
step at a time, and decides only when each happens.

Arguments come in bundles (named tuples): `StepRule` (the algorithm and its
knobs), `Shared` (the arrays every worker shares), `Inputs` (the training
set) and `Own` (one worker's workspace, random stream and records); and two
flags as network.train_steps takes them, each None or True: `augment`
(iasgd.nn.augment.augment_argument) and `knobs` (iasgd.nn.plan.knobs_argument).
With None numba drops the branch they guard before it types the function, so
a run in the paper's setting compiles neither the augmentation nor the
optimiser's other knobs into its loop (a threaded run's cold start about
1.1 s shorter: docs/performance.md).

Staleness: tau = V just before the update is applied minus V when the worker
read the parameters (see iasgd.protocol.gate).
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from iasgd.compiled import jit_fastmath, jit_inline
from iasgd.nn import augment as A
from iasgd.nn import network as N
from iasgd.nn.augment import next_random
from iasgd.nn.plan import Images, copy_values
from iasgd.protocol import gate as G
from iasgd.protocol.atomics import atomic_add, atomic_cas, atomic_load, monotonic_ns

HOGWILD, ASYNC, INTERVAL = 0, 1, 2  # the algorithms of async_worker

# Every function here but the two worker loops is inlined into its caller
# (iasgd.compiled.jit_inline): the loops are the only compiled functions of
# a run's steps job, and they take the layer kernels' fast-math flags that
# inlined code is compiled with. Their own code is integers and atomics;
# the float arithmetic (the step's loss and gradient, the update) is the
# kernels', which always had those flags, so the simulator's step-by-step
# calls and a real thread's loop compute the same bits.

# Columns of a worker's int64 counter row (rows padded to a cache line multiple).
COMPUTED, APPLIED, DROPPED, TAU_SUM, TAU_MAX, WAIT_NS, STEPS_NS, VIOLATIONS, SLICES = range(9)
COUNTER_COLUMNS = 16
# Slots of the shared `probe` array: steps running right now, their maximum,
# and the losses written into the loss ring so far.
ACTIVE, ACTIVE_MAX, LOSS_POS = 0, 1, 2

# algo: HOGWILD, ASYNC, INTERVAL (or any, for sync); policy: gate.WAIT or DROP;
# sgd: the step's hyper-parameters (iasgd.nn.plan.Sgd)
StepRule = namedtuple("StepRule", ["algo", "policy", "sgd"])
# state: the gate; probe: (8,) int64; params, velocity: (P,) float32;
# lr_factors: (bins,) float32 step-size factor by tau; ring: the loss ring
Shared = namedtuple("Shared", ["state", "probe", "params", "velocity", "lr_factors", "ring"])
# images (M, D) uint8 -> images * scale + shift; labels (M,) int64; the
# augmentation: shape, pad, flip (iasgd.nn.plan.Images)
Inputs = Images
# local: (P,) a private copy of the parameters (async's snapshot; the
# simulator's read); grad: (P,); acts, dacts, argmax, net (the kernels'
# Net: plan and ops): the model's workspace; batch_labels, idx: (b,); rng: (1,) uint64 random
# stream; counters: (COUNTER_COLUMNS,) int64; hist: (bins,) staleness of this
# epoch; loss_sum: (1,) float64 sum of this epoch's applied losses; codes:
# (b, augment.CODES) int64, the batch's augmentation codes (drawn with idx)
Own = namedtuple("Own", ["local", "grad", "acts", "dacts", "argmax", "net", "batch_labels",
                         "idx", "rng", "counters", "hist", "loss_sum", "codes"])

@jit_inline
def draw_batch(idx, count, rng):
    """idx[:] = uniform draws from [0, count), with replacement."""
    n = np.uint64(count)
    for i in range(idx.size):
        idx[i] = np.int64(next_random(rng) % n)


@jit_inline
def draw_step_batch(inputs, own, augment):
    """Draw a batch from own's stream: its indices into own.idx, then (where
    `augment`) each sample's augmentation code into own.codes."""
    draw_batch(own.idx, inputs.images.shape[0], own.rng)
    if augment is not None:
        A.draw_codes(own.codes, own.idx.size, inputs.pad, inputs.flip, own.rng)


@jit_inline
def gather_batch(inputs, own, augment):
    """The batch own.idx names: its inputs into the start of own.acts
    (augmented with own.codes where `augment`), its labels into
    own.batch_labels."""
    n, D = own.idx.size, inputs.images.shape[1]
    x = own.acts[:n * D].reshape((n, D))
    if augment is not None:
        A.gather_augmented(inputs.images, own.idx, own.codes, inputs.shape, inputs.scale,
                           inputs.shift, x)
    else:
        N.gather_images(inputs.images, own.idx, inputs.scale, inputs.shift, x)
    for i in range(n):
        own.batch_labels[i] = inputs.labels[own.idx[i]]


@jit_inline
def _load_batch(inputs, own, augment):
    """Draw a batch (draw_step_batch) and gather it."""
    draw_step_batch(inputs, own, augment)
    gather_batch(inputs, own, augment)


@jit_inline
def _enter_step(probe):
    now = atomic_add(probe, ACTIVE, 1) + 1
    while True:  # probe[ACTIVE_MAX] = max(probe[ACTIVE_MAX], now)
        seen = atomic_load(probe, ACTIVE_MAX)
        if now <= seen or atomic_cas(probe, ACTIVE_MAX, seen, now) == seen:
            return


@jit_inline
def _leave_step(probe):
    atomic_add(probe, ACTIVE, -1)


@jit_inline
def record_update(own, shared, tau, loss):
    """Account one applied gradient; its loss also goes into the shared ring
    that the loss monitor reads."""
    c = own.counters
    c[APPLIED] += 1
    c[TAU_SUM] += tau
    c[TAU_MAX] = max(c[TAU_MAX], tau)
    own.hist[min(tau, own.hist.size - 1)] += 1
    own.loss_sum[0] += loss
    ring = shared.ring
    ring[atomic_add(shared.probe, LOSS_POS, 1) % ring.size] = loss


# ------------------------------------------------------------ one step


@jit_inline
def read_step(rule, shared, inputs, own, snapshot, augment):
    """After the ticket (and slot): draw the batch and read the parameters.
    Returns V at the read. async reads a consistent snapshot into own.local
    under the lock; otherwise the step reads the shared array as it computes
    (Hogwild!). With `snapshot` (the simulator, whose workers share one
    workspace) every algorithm copies the parameters into own.local and
    only the batch is drawn (its indices and codes): gather_batch fills the workspace
    right before compute_step."""
    if snapshot:
        draw_step_batch(inputs, own, augment)
    else:
        _load_batch(inputs, own, augment)
    state = shared.state
    if rule.algo == ASYNC:
        G.lock(state)
        copy_values(shared.params, own.local)
        v_read = G.read_version(state)
        G.unlock(state)
        return v_read
    v_read = G.read_version(state)
    if snapshot:
        copy_values(shared.params, own.local)
    return v_read


@jit_inline
def compute_step(rule, shared, own, params, knobs):
    """Forward and backward of own's batch at `params` (the shared array or
    own.local); the gradient into own.grad. Returns the batch's mean loss."""
    smoothing = N.loss_smoothing(rule.sgd, knobs)
    _enter_step(shared.probe)
    loss = N.network_loss_and_grad(params, own.grad, own.net, own.acts, own.dacts,
                                   own.argmax, own.batch_labels, smoothing)
    _leave_step(shared.probe)
    own.counters[COMPUTED] += 1
    return loss


@jit_inline
def apply_step(gen, v_read, loss, rule, shared, own, knobs):
    """Commit and apply own.grad, read at V = v_read in interval `gen`:
    returns 1 if applied (and recorded), 0 if the drop gate dropped it, -1
    if its loss is not finite (the run is marked diverged)."""
    state = shared.state
    interval = rule.algo == INTERVAL
    if not np.isfinite(loss):
        G.mark_diverged(state)
        G.return_ticket(state)
        return -1
    if not G.commit_step(state, gen, interval and rule.policy == G.DROP):
        own.counters[DROPPED] += 1  # before the ticket goes back: the epoch may end then
        G.return_ticket(state)
        return 0
    if rule.algo == ASYNC:
        G.lock(state)
    v_now = G.begin_apply(state)  # the updates applied before this one
    tau = v_now - v_read
    factors = shared.lr_factors
    factor = factors[min(tau, factors.size - 1)]
    N.apply_update(shared.params, shared.velocity, own.grad, rule.sgd, v_now, factor, 0, knobs)
    if rule.algo == ASYNC:
        G.unlock(state)
    elif interval:
        # read in interval gen, applied in it, within its y - 1
        if G.crossed(state, gen) or tau > atomic_load(state, G.Y) - 1:
            own.counters[VIOLATIONS] += 1
        G.finish_apply(state)
    record_update(own, shared, tau, loss)
    G.settle(state)
    return 1


@jit_fastmath
def async_worker(wid, rule, shared, inputs, own, augment, knobs):
    """Worker `wid` of hogwild, async (lock-based) or interval, for the whole
    run: it takes steps while the gate allows them and sleeps between
    allowances, until the run stops. A non-finite loss is not applied: it
    marks the run diverged and stops it."""
    state = shared.state
    wait = rule.algo == INTERVAL and rule.policy == G.WAIT
    t_start = monotonic_ns()
    while True:
        if not G.acquire_ticket(state, wid):
            break
        t0 = monotonic_ns()
        gen = G.enter_interval(state, wait)
        own.counters[WAIT_NS] += monotonic_ns() - t0
        if gen < 0:
            break
        v_read = read_step(rule, shared, inputs, own, False, augment)
        loss = compute_step(rule, shared, own,
                            own.local if rule.algo == ASYNC else shared.params, knobs)
        if apply_step(gen, v_read, loss, rule, shared, own, knobs) < 0:
            break
    own.counters[STEPS_NS] += monotonic_ns() - t_start


# ------------------------------------------------------------------ sync


@jit_inline
def round_gradient(rule, shared, inputs, own, grad, augment, knobs):
    """A sync round's gradient of a fresh batch at the shared parameters,
    into `grad` (a row of the round's (n, P) array). Returns its loss."""
    smoothing = N.loss_smoothing(rule.sgd, knobs)
    _load_batch(inputs, own, augment)
    _enter_step(shared.probe)
    loss = N.network_loss_and_grad(shared.params, grad, own.net, own.acts, own.dacts,
                                   own.argmax, own.batch_labels, smoothing)
    _leave_step(shared.probe)
    own.counters[COMPUTED] += 1
    return loss


@jit_inline
def apply_round(rule, shared, grads, active, done, lo, hi, out, knobs):
    """Columns [lo, hi) of a sync round's update: their mean over the first
    `active` rows of grads (n, P) into out (hi - lo,), applied to the shared
    parameters with the step size of update `done` (the gradients applied
    before this round). `out` may be those columns of one of the rows: each
    column is read before it is written."""
    N.mean_rows(grads, active, lo, hi, out)
    N.apply_update(shared.params[lo:hi], shared.velocity[lo:hi], out, rule.sgd, done, 1.0, lo,
                   knobs)


@jit_inline
def _timed_barrier(state, parties, sense, counters):
    """Flip this worker's sense and pass the barrier, timing the wait.
    Returns the barrier's answer (1 go on, 0 stop, -1 a worker failed)."""
    t0 = monotonic_ns()
    sense[0] = 1 - sense[0]
    go = G.barrier(state, parties, sense[0])
    counters[WAIT_NS] += monotonic_ns() - t0
    return go


@jit_fastmath
def sync_worker(wid, parties, rule, shared, inputs, own, grads, sense, augment, knobs):
    """One worker of synchronous parallel SGD for the whole run, in rounds:
    every worker computes a gradient on the same parameters into grads[wid]
    (the last round of an allowance may use fewer workers), a barrier, each
    worker averages and applies its slice of the parameters, a barrier. A
    stop is decided at the first barrier by the last worker to arrive, for
    all alike, so a round is applied whole or not at all. sense: (1,) this
    worker's barrier sense, kept across calls."""
    state = shared.state
    P = shared.params.size
    lo = wid * P // parties
    hi = (wid + 1) * P // parties
    t_start = monotonic_ns()
    done = atomic_load(state, G.DONE)  # gradients of the rounds so far, alike in every worker
    while True:
        active = G.sync_round_size(state, parties, done)
        if active < 0:
            break
        if active == 0:
            G.wait_for_allowance(state, done)
            continue
        loss = 0.0
        G.stop_if_past_deadline(state)  # the round is then cancelled at the barrier
        if wid < active and not G.stopped(state):
            loss = round_gradient(rule, shared, inputs, own, grads[wid], augment, knobs)
            if not np.isfinite(loss):  # averaged in, it would poison every parameter
                G.mark_diverged(state)
        if _timed_barrier(state, parties, sense, own.counters) != 1:
            break  # cancelled as a whole: nobody applies this round
        # Columns [lo, hi) are this worker's alone: it may overwrite them in its
        # own row with the mean (the next round's backward rewrites the row).
        apply_round(rule, shared, grads, active, done, lo, hi, grads[wid, lo:hi], knobs)
        own.counters[SLICES] += 1
        if wid < active:
            record_update(own, shared, 0, loss)
        go = _timed_barrier(state, parties, sense, own.counters)
        if go < 0:
            break
        done += active
        if wid == 0:  # every slice is in: the round counts
            atomic_add(state, G.VERSION, 1)
            G.settle_many(state, active)
        if go == 0:
            break
    own.counters[STEPS_NS] += monotonic_ns() - t_start


# ----------------------------------------------------- bundles (plain Python)


def new_own(ws, local: np.ndarray, counters: np.ndarray, hist: np.ndarray,
            loss_sum: np.ndarray, rng: np.ndarray) -> Own:
    """One worker's bundle over a model workspace `ws` (iasgd.nn.models) and the
    given rows of the executor's per-worker arrays."""
    return Own(local, ws.grad, ws.acts, ws.dacts, ws.argmax, ws.net, ws.labels,
               np.zeros(ws.capacity, np.int64), rng, counters, hist, loss_sum,
               np.zeros((ws.capacity, A.CODES), np.int64))


def stream_seed(seed: int, wid: int, segment: int) -> np.uint64:
    """The first state of worker wid's random stream in a run's segment (how
    often it was resumed)."""
    return np.random.SeedSequence([seed, 2, wid, segment]).generate_state(1, np.uint64)[0]
