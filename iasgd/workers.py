"""The compiled worker loops of the parallel algorithms.

A worker thread makes one call per epoch into one of these loops, which runs
with the GIL released until the epoch's tickets are used up or the run is
stopped: draw a batch, read the parameters, forward, backward, pass the gate,
apply the update, record staleness and loss. Python does nothing per step.

Staleness: tau = V just before the update is applied minus V when the worker
read the parameters (see iasgd.gate).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from iasgd import gate as G
from iasgd import kernels as K
from iasgd.atomics import atomic_add, atomic_cas, atomic_load, monotonic_ns

HOGWILD, ASYNC, INTERVAL = 0, 1, 2  # the algorithms of async_worker

# Columns of a worker's int64 counter row (rows padded to a cache line multiple).
COMPUTED, APPLIED, DROPPED, TAU_SUM, TAU_MAX, WAIT_NS, STEPS_NS, VIOLATIONS = range(8)
COUNTER_COLUMNS = 16
# Slots of the shared `probe` array: steps running right now, their maximum,
# and the losses written into the loss ring so far.
ACTIVE, ACTIVE_MAX, LOSS_POS = 0, 1, 2

jit = nb.njit(nogil=True, cache=True)


@jit
def seed_stream(seed):
    """Seed this thread's numba random stream (each thread has its own)."""
    np.random.seed(seed)


@jit
def draw_batch(idx, count):
    """idx[:] = uniform draws from [0, count), with replacement."""
    for i in range(idx.size):
        idx[i] = np.random.randint(0, count)


@jit
def _load_batch(images, labels, scale, shift, idx, x, batch_labels):
    """Draw a batch: its indices into idx, its inputs into x, labels into
    batch_labels."""
    draw_batch(idx, images.shape[0])
    K.gather_images(images, idx, scale, shift, x)
    for i in range(idx.size):
        batch_labels[i] = labels[idx[i]]


@jit
def _enter_step(probe):
    now = atomic_add(probe, ACTIVE, 1) + 1
    while True:  # probe[ACTIVE_MAX] = max(probe[ACTIVE_MAX], now)
        seen = atomic_load(probe, ACTIVE_MAX)
        if now <= seen or atomic_cas(probe, ACTIVE_MAX, seen, now) == seen:
            return


@jit
def _leave_step(probe):
    atomic_add(probe, ACTIVE, -1)


@jit
def _record(counters, hist, loss_sum, tau, loss, probe, ring):
    """Account one applied gradient; its loss also goes into the shared ring
    that the loss monitor reads."""
    counters[APPLIED] += 1
    counters[TAU_SUM] += tau
    counters[TAU_MAX] = max(counters[TAU_MAX], tau)
    hist[min(tau, hist.size - 1)] += 1
    loss_sum[0] += loss
    ring[atomic_add(probe, LOSS_POS, 1) % ring.size] = loss


@jit
def async_worker(wid, algo, policy, state, probe, params, velocity, local, grad, acts, dacts,
                 argmax, batch_labels, idx, plan, images, scale, shift,
                 labels, lr, momentum, lr_factors, counters, hist, loss_sum, ring):
    """Worker `wid` of hogwild, async (lock-based) or interval, for one epoch.

    state: the gate (iasgd.gate); params, velocity: shared (P,) float32;
    local: (P,) private copy (async reads a consistent snapshot into it);
    grad/acts/dacts/argmax/batch_labels/idx: this worker's workspace;
    images (M, D) uint8 -> images * scale + shift; labels (M,) int64;
    lr_factors: step-size factor by staleness (last entry for all larger tau);
    counters: this worker's row; hist: (bins,) its staleness histogram of
    this epoch; loss_sum: (1,) the sum of its applied steps' losses this
    epoch; ring: shared loss ring. Workers wid >= the gate's M park (the
    adaptive thread count). A non-finite loss is not applied: it marks the run
    diverged and stops it.
    """
    D = images.shape[1]
    n = idx.size
    x = acts[:n * D].reshape((n, D))
    t_start = monotonic_ns()
    while G.park_while_inactive(state, wid) and G.take_ticket(state):
        gen = 0
        if algo == INTERVAL and policy == G.WAIT:
            t0 = monotonic_ns()
            gen = G.wait_for_slot(state)
            counters[WAIT_NS] += monotonic_ns() - t0
            if gen < 0:  # stopped while waiting
                G.return_ticket(state)
                break
        elif algo == INTERVAL:
            gen = G.generation(state)
        _load_batch(images, labels, scale, shift, idx, x, batch_labels)
        if algo == ASYNC:  # consistent read: a snapshot under the lock
            G.lock(state)
            local[:] = params
            v_read = atomic_load(state, G.VERSION)
            G.unlock(state)
            read = local
        else:  # Hogwild!-style: read the shared array as it is
            v_read = atomic_load(state, G.VERSION)
            read = params
        _enter_step(probe)
        loss = K.network_loss_and_grad(read, grad, plan, acts, dacts,
                                       argmax, batch_labels)
        _leave_step(probe)
        counters[COMPUTED] += 1
        if not np.isfinite(loss):
            G.mark_diverged(state)
            G.return_ticket(state)
            break
        if algo == INTERVAL and policy == G.DROP and not G.claim_slot(state, gen):
            counters[DROPPED] += 1
            G.return_ticket(state)
            continue
        if algo == ASYNC:
            G.lock(state)
        tau = G.begin_apply(state) - v_read
        factor = lr_factors[min(tau, lr_factors.size - 1)]
        K.sgd_momentum_update(params, velocity, grad, lr * factor, momentum)
        if algo == ASYNC:
            G.unlock(state)
        elif algo == INTERVAL:
            # this update's interval is still the current one: check its bound
            if tau > atomic_load(state, G.Y) - 1:
                counters[VIOLATIONS] += 1
            G.finish_apply(state)
        _record(counters, hist, loss_sum, tau, loss, probe, ring)
    counters[STEPS_NS] += monotonic_ns() - t_start


@jit
def _timed_barrier(state, parties, sense, counters):
    """Flip this worker's sense and pass the barrier, timing the wait."""
    t0 = monotonic_ns()
    sense[0] = 1 - sense[0]
    ok = G.barrier(state, parties, sense[0])
    counters[WAIT_NS] += monotonic_ns() - t0
    return ok


@jit
def sync_worker(wid, parties, count, state, probe, params, velocity, grads,
                acts, dacts, argmax, batch_labels, idx, plan, images,
                scale, shift, labels, lr, momentum, counters, hist, loss_sum, ring, sense):
    """One worker of synchronous parallel SGD, for one epoch of `count`
    gradients, in rounds: every worker computes a gradient on the same
    parameters into grads[wid] (the last round may use fewer workers), a
    barrier, each worker averages and applies its slice of the parameters,
    a barrier. sense: (1,) this worker's barrier sense, kept across epochs."""
    D = images.shape[1]
    n = idx.size
    x = acts[:n * D].reshape((n, D))
    P = params.size
    lo = wid * P // parties
    hi = (wid + 1) * P // parties
    t_start = monotonic_ns()
    done = 0
    while done * parties < count and not G.stopped(state):
        active = min(parties, count - done * parties)
        loss = 0.0
        if wid < active:
            _load_batch(images, labels, scale, shift, idx, x, batch_labels)
            _enter_step(probe)
            loss = K.network_loss_and_grad(params, grads[wid], plan, acts,
                                           dacts, argmax, batch_labels)
            _leave_step(probe)
            counters[COMPUTED] += 1
            if not np.isfinite(loss):  # averaged in, it would poison every parameter
                G.mark_diverged(state)
        if not _timed_barrier(state, parties, sense, counters):
            break
        # Columns [lo, hi) are this worker's alone: it may overwrite them in its
        # own row with the mean (the next round's backward rewrites the row).
        K.mean_rows(grads, active, lo, hi, grads[wid, lo:hi])
        K.sgd_momentum_update(params[lo:hi], velocity[lo:hi], grads[wid, lo:hi], lr, momentum)
        if wid < active:  # counted once the round's update is in
            _record(counters, hist, loss_sum, 0, loss, probe, ring)
        if wid == 0:
            atomic_add(state, G.VERSION, 1)
        if not _timed_barrier(state, parties, sense, counters):
            break
        done += 1
    counters[STEPS_NS] += monotonic_ns() - t_start
