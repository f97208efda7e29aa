"""Atomic operations on int64 numpy arrays, callable from nopython code.

numba has no atomics for CPU code (numba issue #2988), so these are intrinsics
that emit LLVM's `atomicrmw`, `cmpxchg` and atomic load/store, all sequentially
consistent. They act on `arr[i]` of a 1-d C-contiguous int64 array.

    atomic_add(arr, i, v) -> old value          (fetch-and-add)
    atomic_cas(arr, i, expected, new) -> old    (success iff old == expected)
    atomic_load(arr, i) -> value
    atomic_store(arr, i, v)
    cpu_relax()         a spin-wait hint (x86 `pause`); no-op elsewhere
    sleep_us(us)        give the core away for about `us` microseconds (libc usleep)
    monotonic_ns()      CLOCK_MONOTONIC in nanoseconds (libc clock_gettime)
    futex_wait(arr, i, expected, timeout_us)
                        sleep while the low 32 bits of arr[i] equal `expected`,
                        at most timeout_us; may return early (callers re-check)
    futex_wake_all(arr, i)
                        wake every thread sleeping in futex_wait on arr[i]
    futex_wait_shared, futex_wake_all_shared
                        the same for an array in memory that processes share
                        (a shared futex: keyed by the page, not the process);
                        each flavour wakes only sleepers of its own

Platforms. Linux on x86_64 and aarch64 sleeps on futexes. Elsewhere (macOS,
other Linux processors), or on Linux with IASGD_PORTABLE_WAIT=1, the portable
wait sleeps PORTABLE_SLEEP_US at a time while the word is unchanged, and
futex_wake_all does nothing: slower to wake, equally correct, since every
waiter re-checks its condition. Other systems, and 32-bit ones, are refused
at import with one line (the timespec layout and the libc calls used here
are those of 64-bit Linux and macOS).

With NUMBA_DISABLE_JIT=1 the same names are plain Python functions serialised by
one lock, so the test suite still runs (slowly) without compilation.
"""

from __future__ import annotations

import os
import platform
import struct
import threading
import time

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from iasgd.compiled import PORTABLE_WAIT_VARIABLE

_ORDER = "seq_cst"
_I64 = ir.IntType(64)

_SYSTEM = platform.system()
_MACHINE = platform.machine().lower()
# CLOCK_MONOTONIC of <time.h>; timespec is {int64 tv_sec; int64 tv_nsec} on both
_CLOCK_IDS = {"Linux": 1, "Darwin": 6}
if _SYSTEM not in _CLOCK_IDS or struct.calcsize("P") != 8:
    raise ImportError(f"iasgd runs on 64-bit Linux or macOS, not {_SYSTEM} {_MACHINE}: "
                      "use one of those (on Windows, WSL2 works)")
_CLOCK_MONOTONIC = _CLOCK_IDS[_SYSTEM]
_FUTEX_SYSCALLS = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}
_SYS_FUTEX = (_FUTEX_SYSCALLS.get(_MACHINE) if _SYSTEM == "Linux"
              and os.environ.get(PORTABLE_WAIT_VARIABLE, "") in ("", "0") else None)
WAIT_KIND = "futex" if _SYS_FUTEX is not None else "portable"
PORTABLE_SLEEP_US = 20


def _item_pointer(context, builder, arrty, arr, idx):
    array = context.make_array(arrty)(context, builder, arr)
    return cgutils.get_item_pointer(context, builder, arrty, array, [idx], wraparound=False)


def _check(arr, *scalars):
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64 and arr.ndim == 1):
        raise numba.core.errors.TypingError("atomics need a 1-d int64 array")
    if not all(isinstance(s, types.Integer) for s in scalars):
        raise numba.core.errors.TypingError("atomics need integer index and values")


@intrinsic
def _atomic_add(typingctx, arr, idx, value):
    _check(arr, idx, value)

    def codegen(context, builder, sig, args):
        ptr = _item_pointer(context, builder, sig.args[0], args[0], args[1])
        v = context.cast(builder, args[2], sig.args[2], types.int64)
        return builder.atomic_rmw("add", ptr, v, _ORDER)

    return types.int64(arr, idx, value), codegen


@intrinsic
def _atomic_cas(typingctx, arr, idx, expected, new):
    _check(arr, idx, expected, new)

    def codegen(context, builder, sig, args):
        ptr = _item_pointer(context, builder, sig.args[0], args[0], args[1])
        exp = context.cast(builder, args[2], sig.args[2], types.int64)
        val = context.cast(builder, args[3], sig.args[3], types.int64)
        pair = builder.cmpxchg(ptr, exp, val, _ORDER, _ORDER)
        return builder.extract_value(pair, 0)

    return types.int64(arr, idx, expected, new), codegen


@intrinsic
def _atomic_load(typingctx, arr, idx):
    _check(arr, idx)

    def codegen(context, builder, sig, args):
        ptr = _item_pointer(context, builder, sig.args[0], args[0], args[1])
        return builder.load_atomic(ptr, _ORDER, 8)

    return types.int64(arr, idx), codegen


@intrinsic
def _atomic_store(typingctx, arr, idx, value):
    _check(arr, idx, value)

    def codegen(context, builder, sig, args):
        ptr = _item_pointer(context, builder, sig.args[0], args[0], args[1])
        v = context.cast(builder, args[2], sig.args[2], types.int64)
        builder.store_atomic(v, ptr, _ORDER, 8)
        return context.get_dummy_value()

    return types.none(arr, idx, value), codegen


_X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")


@intrinsic
def _cpu_relax(typingctx):
    def codegen(context, builder, sig, args):
        if _X86:
            fnty = ir.FunctionType(ir.VoidType(), [])
            builder.call(cgutils.get_or_insert_function(builder.module, fnty,
                                                        "llvm.x86.sse2.pause"), [])
        return context.get_dummy_value()

    return types.none(), codegen


@intrinsic
def _sleep_us(typingctx, us):
    if not isinstance(us, types.Integer):
        raise numba.core.errors.TypingError("sleep_us needs an integer")

    def codegen(context, builder, sig, args):
        # Declared by name, so the symbol is resolved when the code is loaded:
        # the compiled function stays cacheable.
        fnty = ir.FunctionType(ir.IntType(32), [ir.IntType(32)])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "usleep")
        builder.call(fn, [builder.trunc(context.cast(builder, args[0], sig.args[0],
                                                     types.int64), ir.IntType(32))])
        return context.get_dummy_value()

    return types.none(us), codegen


@intrinsic
def _monotonic_ns(typingctx):
    def codegen(context, builder, sig, args):
        timespec = ir.LiteralStructType([_I64, _I64])  # tv_sec, tv_nsec
        ts = cgutils.alloca_once(builder, timespec)
        fnty = ir.FunctionType(ir.IntType(32), [ir.IntType(32), timespec.as_pointer()])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "clock_gettime")
        builder.call(fn, [ir.Constant(ir.IntType(32), _CLOCK_MONOTONIC), ts])
        sec = builder.load(cgutils.gep_inbounds(builder, ts, 0, 0))
        nsec = builder.load(cgutils.gep_inbounds(builder, ts, 0, 1))
        return builder.add(builder.mul(sec, ir.Constant(_I64, 1_000_000_000)), nsec)

    return types.int64(), codegen


_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
# FUTEX_PRIVATE_FLAG: the kernel keys a private futex by the process's address
# space (cheaper: no page lookup), so its wake reaches only the threads of that
# process. A shared one is keyed by the page it lies on and wakes sleepers in
# every process that maps it (iasgd.torch's gate, in shared memory).
_PRIVATE = 128
_INT_MAX = 2**31 - 1


def _futex_call(context, builder, sig, args, op, value, timeout_ptr):
    ptr = _item_pointer(context, builder, sig.args[0], args[0], args[1])
    fnty = ir.FunctionType(_I64, [_I64], var_arg=True)
    syscall = cgutils.get_or_insert_function(builder.module, fnty, "syscall")
    null = ir.Constant(_I64, 0)
    # the low half of the int64 slot is the 32-bit futex word (little-endian)
    builder.call(syscall, [ir.Constant(_I64, _SYS_FUTEX), builder.ptrtoint(ptr, _I64),
                           ir.Constant(_I64, op), value, timeout_ptr, null, null])


def _futex_wait_intrinsic(op):
    """futex_wait with the futex operation `op` (private or shared)."""

    @intrinsic
    def futex_wait_op(typingctx, arr, idx, expected, timeout_us):
        _check(arr, idx, expected, timeout_us)

        def codegen(context, builder, sig, args):
            us = context.cast(builder, args[3], sig.args[3], types.int64)
            exp = context.cast(builder, args[2], sig.args[2], types.int64)
            low = builder.and_(exp, ir.Constant(_I64, 0xFFFFFFFF))
            if _SYS_FUTEX is None:  # portable: one short sleep while the word is unchanged
                ptr = _item_pointer(context, builder, sig.args[0], args[0], args[1])
                word = builder.and_(builder.load_atomic(ptr, _ORDER, 8),
                                    ir.Constant(_I64, 0xFFFFFFFF))
                with builder.if_then(builder.icmp_unsigned("==", word, low)):
                    short = ir.Constant(_I64, PORTABLE_SLEEP_US)
                    pick = builder.select(builder.icmp_signed("<", us, short), us, short)
                    fnty = ir.FunctionType(ir.IntType(32), [ir.IntType(32)])
                    fn = cgutils.get_or_insert_function(builder.module, fnty, "usleep")
                    builder.call(fn, [builder.trunc(pick, ir.IntType(32))])
                return context.get_dummy_value()
            timespec = ir.LiteralStructType([_I64, _I64])
            ts = cgutils.alloca_once(builder, timespec)
            million = ir.Constant(_I64, 1_000_000)
            builder.store(builder.sdiv(us, million), cgutils.gep_inbounds(builder, ts, 0, 0))
            builder.store(builder.mul(builder.srem(us, million), ir.Constant(_I64, 1000)),
                          cgutils.gep_inbounds(builder, ts, 0, 1))
            _futex_call(context, builder, sig, args, op, low, builder.ptrtoint(ts, _I64))
            return context.get_dummy_value()

        return types.none(arr, idx, expected, timeout_us), codegen

    return futex_wait_op


def _futex_wake_all_intrinsic(op):
    """futex_wake_all with the futex operation `op` (private or shared)."""

    @intrinsic
    def futex_wake_all_op(typingctx, arr, idx):
        _check(arr, idx)

        def codegen(context, builder, sig, args):
            if _SYS_FUTEX is not None:
                _futex_call(context, builder, sig, args, op,
                            ir.Constant(_I64, _INT_MAX), ir.Constant(_I64, 0))
            return context.get_dummy_value()

        return types.none(arr, idx), codegen

    return futex_wake_all_op


_futex_wait = _futex_wait_intrinsic(_FUTEX_WAIT | _PRIVATE)
_futex_wake_all = _futex_wake_all_intrinsic(_FUTEX_WAKE | _PRIVATE)
_futex_wait_shared = _futex_wait_intrinsic(_FUTEX_WAIT)
_futex_wake_all_shared = _futex_wake_all_intrinsic(_FUTEX_WAKE)


if numba.config.DISABLE_JIT:
    _lock = threading.Lock()

    def atomic_add(arr: np.ndarray, i: int, v: int) -> int:
        with _lock:
            old = int(arr[i])
            arr[i] = old + v
            return old

    def atomic_cas(arr: np.ndarray, i: int, expected: int, new: int) -> int:
        with _lock:
            old = int(arr[i])
            if old == expected:
                arr[i] = new
            return old

    def atomic_load(arr: np.ndarray, i: int) -> int:
        with _lock:
            return int(arr[i])

    def atomic_store(arr: np.ndarray, i: int, v: int) -> None:
        with _lock:
            arr[i] = v

    def cpu_relax() -> None:
        time.sleep(0)  # let the other Python threads run

    def sleep_us(us: int) -> None:
        time.sleep(us * 1e-6)

    def monotonic_ns() -> int:
        return time.monotonic_ns()

    def futex_wait(arr: np.ndarray, i: int, expected: int, timeout_us: int) -> None:
        if int(arr[i]) & 0xFFFFFFFF == expected & 0xFFFFFFFF:
            time.sleep(min(timeout_us, PORTABLE_SLEEP_US) * 1e-6)

    def futex_wake_all(arr: np.ndarray, i: int) -> None:
        pass  # sleepers in the fallback wake up by themselves

    futex_wait_shared, futex_wake_all_shared = futex_wait, futex_wake_all

else:
    atomic_add = _atomic_add
    atomic_cas = _atomic_cas
    atomic_load = _atomic_load
    atomic_store = _atomic_store
    cpu_relax = _cpu_relax
    sleep_us = _sleep_us
    monotonic_ns = _monotonic_ns
    futex_wait = _futex_wait
    futex_wake_all = _futex_wake_all
    futex_wait_shared = _futex_wait_shared
    futex_wake_all_shared = _futex_wake_all_shared
