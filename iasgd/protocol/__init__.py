"""The nopython floor: what one parallel step does, compiled once and run by
every executor (real threads, the simulator, a cluster's nodes).

- `atomics`: sequentially consistent atomic operations, futex sleeps and the
  monotonic clock, callable from compiled code.
- `gate`: the protocol on one int64 state array: tickets, the interval gate of
  Interval-Asynchrony, parking, async's lock, sync's rounds.
- `workers`: a step as four calls (ticket and slot, read, compute, apply) and
  the worker loops that make them on real threads.

Rules for code here (what the rest of the package may rely on):
- compiled with `iasgd.compiled`'s decorators (nogil, cached), nopython: no
  Python objects, no I/O, no allocation on a worker's per-step path; every
  function below the two worker loops is `jit_inline` (copied into its
  caller: one compiled function per loop), the loops `jit_fastmath`;
- shared words are read and written through `atomics` only, in the order each
  function's docstring states;
- `tests/protocol/gate_model.py` runs `gate` and `workers` step by step
  under a scheduler that explores the interleavings of their atomic
  operations, and `tests/protocol/mutants.py` plants bugs here that the
  suite must catch: an edit that changes an order of atomic steps needs
  both to follow.
"""
