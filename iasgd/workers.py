"""The compiled worker loops of the parallel algorithms.

A worker thread makes one call per run into one of these loops, which runs
with the GIL released until the run is stopped: take a ticket (sleeping
between epochs), draw a batch, read the parameters, forward, backward, pass
the gate, apply the update, record staleness and loss. Python does nothing
per step.

Staleness: tau = V just before the update is applied minus V when the worker
read the parameters (see iasgd.gate).
"""

from __future__ import annotations

import numpy as np

from iasgd import gate as G
from iasgd import kernels as K
from iasgd.atomics import atomic_add, atomic_cas, atomic_load, monotonic_ns
from iasgd.compiled import jit

HOGWILD, ASYNC, INTERVAL = 0, 1, 2  # the algorithms of async_worker

# Columns of a worker's int64 counter row (rows padded to a cache line multiple).
COMPUTED, APPLIED, DROPPED, TAU_SUM, TAU_MAX, WAIT_NS, STEPS_NS, VIOLATIONS, SLICES = range(9)
COUNTER_COLUMNS = 16
# Slots of the shared `probe` array: steps running right now, their maximum,
# and the losses written into the loss ring so far.
ACTIVE, ACTIVE_MAX, LOSS_POS = 0, 1, 2


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
                 argmax, batch_labels, idx, conv_plan, dense_plan, images, scale, shift,
                 labels, lr, momentum, lr_factors, counters, hist, loss_sum, ring):
    """Worker `wid` of hogwild, async (lock-based) or interval, for the whole
    run: it takes steps while the gate allows them and sleeps between
    allowances, until the run stops (iasgd.gate has the step protocol).

    state: the gate (iasgd.gate); params, velocity: shared (P,) float32;
    local: (P,) private copy (async reads a consistent snapshot into it);
    grad/acts/dacts/argmax/batch_labels/idx: this worker's workspace;
    images (M, D) uint8 -> images * scale + shift; labels (M,) int64;
    lr_factors: step-size factor by staleness (last entry for all larger tau);
    counters: this worker's row; hist: (bins,) its staleness histogram of
    this epoch; loss_sum: (1,) the sum of its applied steps' losses this
    epoch; ring: shared loss ring. A non-finite loss is not applied: it marks
    the run diverged and stops it.
    """
    D = images.shape[1]
    n = idx.size
    x = acts[:n * D].reshape((n, D))
    t_start = monotonic_ns()
    interval = algo == INTERVAL
    wait, drop = interval and policy == G.WAIT, interval and policy == G.DROP
    while True:
        if not G.acquire_ticket(state, wid):
            break
        t0 = monotonic_ns()
        gen = G.enter_interval(state, wait)
        counters[WAIT_NS] += monotonic_ns() - t0
        if gen < 0:
            break
        _load_batch(images, labels, scale, shift, idx, x, batch_labels)
        if algo == ASYNC:  # consistent read: a snapshot under the lock
            G.lock(state)
            local[:] = params
            v_read = G.read_version(state)
            G.unlock(state)
            read = local
        else:  # Hogwild!-style: read the shared array as it is
            v_read = G.read_version(state)
            read = params
        _enter_step(probe)
        loss = K.network_loss_and_grad(read, grad, conv_plan, dense_plan, acts, dacts,
                                       argmax, batch_labels)
        _leave_step(probe)
        counters[COMPUTED] += 1
        if not np.isfinite(loss):
            G.mark_diverged(state)
            G.return_ticket(state)
            break
        if not G.commit_step(state, gen, drop):
            counters[DROPPED] += 1  # before the ticket goes back: the epoch may end then
            G.return_ticket(state)
            continue
        if algo == ASYNC:
            G.lock(state)
        tau = G.begin_apply(state) - v_read
        factor = lr_factors[min(tau, lr_factors.size - 1)]
        K.sgd_momentum_update(params, velocity, grad, lr * factor, momentum)
        if algo == ASYNC:
            G.unlock(state)
        elif interval:
            # read in interval gen, applied in it, within its y - 1
            if G.crossed(state, gen) or tau > atomic_load(state, G.Y) - 1:
                counters[VIOLATIONS] += 1
            G.finish_apply(state)
        _record(counters, hist, loss_sum, tau, loss, probe, ring)
        G.settle(state)
    counters[STEPS_NS] += monotonic_ns() - t_start


@jit
def _timed_barrier(state, parties, sense, counters):
    """Flip this worker's sense and pass the barrier, timing the wait.
    Returns the barrier's answer (1 go on, 0 stop, -1 a worker failed)."""
    t0 = monotonic_ns()
    sense[0] = 1 - sense[0]
    go = G.barrier(state, parties, sense[0])
    counters[WAIT_NS] += monotonic_ns() - t0
    return go


@jit
def sync_worker(wid, parties, state, probe, params, velocity, grads,
                acts, dacts, argmax, batch_labels, idx, conv_plan, dense_plan, images,
                scale, shift, labels, lr, momentum, counters, hist, loss_sum, ring, sense):
    """One worker of synchronous parallel SGD for the whole run, in rounds:
    every worker computes a gradient on the same parameters into grads[wid]
    (the last round of an allowance may use fewer workers), a barrier, each
    worker averages and applies its slice of the parameters, a barrier. A
    stop is decided at the first barrier by the last worker to arrive, for
    all alike, so a round is applied whole or not at all. sense: (1,) this
    worker's barrier sense, kept across calls."""
    D = images.shape[1]
    n = idx.size
    x = acts[:n * D].reshape((n, D))
    P = params.size
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
            _load_batch(images, labels, scale, shift, idx, x, batch_labels)
            _enter_step(probe)
            loss = K.network_loss_and_grad(params, grads[wid], conv_plan, dense_plan, acts,
                                           dacts, argmax, batch_labels)
            _leave_step(probe)
            counters[COMPUTED] += 1
            if not np.isfinite(loss):  # averaged in, it would poison every parameter
                G.mark_diverged(state)
        if _timed_barrier(state, parties, sense, counters) != 1:
            break  # cancelled as a whole: nobody applies this round
        # Columns [lo, hi) are this worker's alone: it may overwrite them in its
        # own row with the mean (the next round's backward rewrites the row).
        K.mean_rows(grads, active, lo, hi, grads[wid, lo:hi])
        K.sgd_momentum_update(params[lo:hi], velocity[lo:hi], grads[wid, lo:hi], lr, momentum)
        counters[SLICES] += 1
        if wid < active:
            _record(counters, hist, loss_sum, 0, loss, probe, ring)
        go = _timed_barrier(state, parties, sense, counters)
        if go < 0:
            break
        done += active
        if wid == 0:  # every slice is in: the round counts
            atomic_add(state, G.VERSION, 1)
            G.settle_many(state, active)
        if go == 0:
            break
    counters[STEPS_NS] += monotonic_ns() - t_start
