"""Atomics under real contention: threads running compiled nogil code start
together (a spin on a shared flag) and hammer the same array slots."""

from __future__ import annotations

import re
import threading
import time

import numba
import numpy as np

from iasgd.compiled import jit  # cached with iasgd's: these inline its atomics
from iasgd.protocol.atomics import (
    atomic_add,
    atomic_cas,
    atomic_load,
    atomic_store,
    futex_wait,
    futex_wake_all,
    monotonic_ns,
    sleep_us,
)

GO, ARRIVED, ADDS, CAS_COUNT, CAS_RETRIES = range(5)


@jit
def _start_together(arr, parties):
    atomic_add(arr, ARRIVED, 1)
    while atomic_load(arr, ARRIVED) < parties:
        pass


@jit
def _hammer_add(arr, parties, m):
    _start_together(arr, parties)
    for _ in range(m):
        atomic_add(arr, ADDS, 1)


@jit
def _hammer_cas(arr, parties, m):
    _start_together(arr, parties)
    retries = 0
    for _ in range(m):
        while True:
            old = atomic_load(arr, CAS_COUNT)
            if atomic_cas(arr, CAS_COUNT, old, old + 1) == old:
                break
            retries += 1
    atomic_add(arr, CAS_RETRIES, retries)


def run_threads(fn, arr, parties, m):
    threads = [threading.Thread(target=fn, args=(arr, parties, m)) for _ in range(parties)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive()


def test_fetch_add_loses_no_increment():
    arr = np.zeros(8, np.int64)
    _hammer_add(arr, 1, 1)  # compile
    for parties in (2, 4, 8):
        arr[:] = 0
        run_threads(_hammer_add, arr, parties, 200_000)
        assert arr[ADDS] == parties * 200_000


def test_compare_and_swap_under_contention():
    arr = np.zeros(8, np.int64)
    _hammer_cas(arr, 1, 1)
    # a busy machine may not run two of them at once: try again, longer
    for m in (200_000, 400_000, 800_000, 1_600_000, 3_200_000, 6_400_000):
        arr[:] = 0
        run_threads(_hammer_cas, arr, 4, m)
        assert arr[CAS_COUNT] == 4 * m
        if arr[CAS_RETRIES] > 0:
            break
    # the CAS loop really raced (two threads on two cores): some attempts failed
    assert arr[CAS_RETRIES] > 0


# Store buffering (the litmus test "SB"): each of two threads stores to its own
# flag, then loads the other's. Under sequential consistency at least one of
# them sees the other's store; x86 and Arm let both loads pass their stores
# unless the stores are seq_cst. The gate's sleep/wake hand-shake (announce,
# then read the word; change the word, then read the sleeper count) is exactly
# this pattern, so a weaker ordering would lose wake-ups.
_SB_GO, _SB_FLAG, _SB_DONE, _SB_STOP = 8, 32, 80, 104  # slots a cache line apart
SB_ROUNDS, SB_PATIENCE_S = 60_000, 60.0


@jit
def _store_buffering(arr, me, rounds, seen, done):
    """Thread `me` of the litmus test, for `rounds` rounds or until
    arr[_SB_STOP] is set; done[me]: the rounds it completed."""
    other = 1 - me
    done[me] = rounds
    for r in range(1, rounds + 1):
        atomic_store(arr, _SB_GO + 8 * me, r)
        while atomic_load(arr, _SB_GO + 8 * other) < r:
            if atomic_load(arr, _SB_STOP):
                done[me] = r - 1
                return
        atomic_store(arr, _SB_FLAG + 24 * me, r)
        seen[r - 1] = atomic_load(arr, _SB_FLAG + 24 * other)
        atomic_store(arr, _SB_DONE + 8 * me, r)
        while atomic_load(arr, _SB_DONE + 8 * other) < r:
            if atomic_load(arr, _SB_STOP):
                done[me] = r
                return


def test_stores_are_sequentially_consistent():
    """No round in which both threads miss the other's store. The rounds need
    both threads on a core at once: on a busy machine they are cut short after
    SB_PATIENCE_S (checked on the rounds done), never failed for being slow."""
    _store_buffering(np.zeros(128, np.int64), 0, 0, np.zeros(1, np.int64),
                     np.zeros(2, np.int64))
    arr, seen = np.zeros(128, np.int64), np.zeros((2, SB_ROUNDS), np.int64)
    done = np.zeros(2, np.int64)
    threads = [threading.Thread(target=_store_buffering,
                                args=(arr, me, SB_ROUNDS, seen[me], done))
               for me in (0, 1)]
    for t in threads:
        t.start()
    threads[0].join(SB_PATIENCE_S)
    arr[_SB_STOP] = 1  # both leave at their next look (a no-op if they are done)
    for t in threads:
        t.join(120)
        assert not t.is_alive()
    rounds = int(done.min())
    assert rounds > 0
    r = np.arange(1, rounds + 1)
    both_missed = int(((seen[0, :rounds] < r) & (seen[1, :rounds] < r)).sum())
    assert both_missed == 0, f"{both_missed} of {rounds} rounds reordered a store and a load"


def test_atomics_are_emitted_sequentially_consistent():
    """The ordering the gate's proof assumes is in the code LLVM is given:
    every atomic load, store, add and compare-exchange is seq_cst. The
    store-buffering test above checks what the hardware then does, but it
    needs both threads on a core at once, which a busy machine seldom gives
    (a mutant with monotonic ordering survived it beside two CPU-bound
    processes); this check does not depend on the load."""
    @numba.njit  # not cached: its LLVM IR is inspected
    def every_atomic(arr):
        atomic_store(arr, 0, 1)
        atomic_add(arr, 1, atomic_load(arr, 0))
        return atomic_cas(arr, 2, 0, 5)

    assert every_atomic(np.zeros(3, np.int64)) == 0
    ir = next(iter(every_atomic.inspect_llvm().values()))
    atomics = [line for line in ir.splitlines()
               if re.search(r"\b(atomicrmw|cmpxchg|load atomic|store atomic)\b", line)]
    assert len(atomics) >= 4, ir
    assert all("seq_cst" in line and "monotonic" not in line for line in atomics), atomics


@jit
def _cas_semantics(arr):
    a = atomic_cas(arr, 0, 5, 7)  # expected 5, is 3: fails, returns 3
    b = atomic_cas(arr, 0, 3, 9)  # succeeds, returns 3
    atomic_store(arr, 1, -4)
    return a, b, atomic_load(arr, 0), atomic_add(arr, 1, 10), arr[1]


def test_operation_semantics():
    arr = np.array([3, 0], np.int64)
    assert _cas_semantics(arr) == (3, 3, 9, -4, 6)


@jit
def _timed_sleep(us):
    t0 = monotonic_ns()
    sleep_us(us)
    return monotonic_ns() - t0


@jit
def _now():
    return monotonic_ns()


def test_clock_and_sleep():
    assert 2_000_000 <= _timed_sleep(2000) < 1_000_000_000
    _now()
    before = time.monotonic_ns()
    now = _now()
    assert before <= now <= time.monotonic_ns()  # the same clock as Python's


@jit
def _sleep_until_changed(arr, timeout_us):
    t0 = monotonic_ns()
    seen = atomic_load(arr, 0)
    atomic_store(arr, 1, 1)  # asleep (about to be)
    while atomic_load(arr, 0) == seen and monotonic_ns() - t0 < timeout_us * 1000:
        futex_wait(arr, 0, seen, timeout_us)
    return monotonic_ns() - t0


@jit
def _bump_and_wake(arr):
    atomic_add(arr, 0, 1)
    futex_wake_all(arr, 0)


def test_futex_sleeps_until_woken_and_times_out():
    arr = np.zeros(2, np.int64)
    assert _sleep_until_changed(arr, 20_000) >= 20_000_000  # nobody wakes it: the timeout
    arr[:] = 0
    box = {}
    t = threading.Thread(target=lambda: box.update(ns=_sleep_until_changed(arr, 10_000_000)))
    t.start()
    while arr[1] == 0:
        time.sleep(0.001)
    time.sleep(0.05)  # let it fall asleep
    _bump_and_wake(arr)
    t.join(5)
    assert not t.is_alive()
    assert box["ns"] < 2_000_000_000  # woken, long before its 10 s timeout


def test_lock_based_fallback_without_jit():
    """NUMBA_DISABLE_JIT=1: the same names work as plain Python under a lock."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = """
import threading, numpy as np
from iasgd.protocol.atomics import atomic_add, atomic_cas, atomic_load
from iasgd.protocol import gate as G
arr = np.zeros(2, np.int64)
def work():
    for _ in range(2000):
        atomic_add(arr, 0, 1)
        while True:
            old = atomic_load(arr, 1)
            if atomic_cas(arr, 1, old, old + 1) == old:
                break
threads = [threading.Thread(target=work) for _ in range(4)]
[t.start() for t in threads]; [t.join() for t in threads]
state = G.new_state(2, limit=3)
assert G.take_ticket(state) and G.wait_for_slot(state) == 0
assert G.begin_apply(state) == 0 and not G.finish_apply(state)
print(arr[0], arr[1])
"""
    env = {**os.environ, "NUMBA_DISABLE_JIT": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["8000", "8000"]


def test_the_gate_on_the_portable_wait():
    """IASGD_PORTABLE_WAIT=1 selects the portable wait (short sleeps, no
    futex) on Linux too: the futex test and a moving-y stress pass on it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "IASGD_PORTABLE_WAIT": "1"}
    env.pop("NUMBA_CACHE_DIR", None)
    check = subprocess.run([sys.executable, "-c",
                            "import iasgd.protocol.atomics as a; print(a.WAIT_KIND)"],
                           env=env, capture_output=True, text=True, timeout=120)
    assert check.stdout.strip() == "portable", check.stderr
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-o", "addopts=",
                          "tests/protocol/test_atomics.py::test_futex_sleeps_until_woken_and_times_out",
                          "tests/protocol/test_gate.py::test_moving_y_keeps_every_update_in_its_interval"
                          "[2-9--1-True-wait]"],
                         cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
