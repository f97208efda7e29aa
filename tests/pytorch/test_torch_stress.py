"""iasgd.torch's gate in real processes: a y = 1 stress with sentinel
parameters (every reader sees every earlier update written, 0 crossings,
over 100,000 updates by 4 and 16 processes), and the shared futexes that
make one process's wake reach another's sleep. (The folder is not named
tests/torch: with tests/ on sys.path, a tests/torch/ would stand in for
PyTorch where it is not installed.)"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
it = pytest.importorskip("iasgd.torch")

from iasgd.protocol import gate as G  # noqa: E402
from iasgd.torch import steps as S  # noqa: E402

UPDATES = 100_000
SENTINEL_SIZE = 256


def sentinel_worker(rank, params, gate, misses):
    """Each step: the first and last parameters must hold every update of
    the intervals before the one read in (y = 1: `gen` updates), and with
    the wait policy exactly V at the read (the slot is taken before the
    read, so no update is in flight). The update adds 1 to both, through
    a numpy view of the shared tensor: the step is trivial, so the gate is
    all there is to the run (tests/pytorch/test_torch_models.py writes
    with torch.optim)."""
    seen = params.detach().numpy()  # a view of the shared tensor

    def write():
        seen[0] += 1
        seen[-1] += 1
    exact = gate.wait
    bad = 0
    try:
        while True:
            with gate.step() as step:
                if seen[0] < step.gen or seen[-1] < step.gen:
                    bad += 1  # missed an update of an earlier interval
                elif exact and (seen[0] != step.v_read or seen[-1] != step.v_read):
                    bad += 1
                step.apply(write)
    finally:
        misses[rank] = bad


@pytest.mark.parametrize("processes", [4, 16])
@pytest.mark.parametrize("policy", ["wait", "drop"])
def test_at_y1_every_read_sees_every_earlier_update(processes, policy):
    params = torch.zeros(SENTINEL_SIZE, requires_grad=True)
    params.share_memory_()
    misses = torch.zeros(processes, dtype=torch.int64).share_memory_()
    gate = it.IntervalGate(1, policy=policy, workers=processes, max_updates=UPDATES)
    t0 = time.perf_counter()
    report = gate.run(sentinel_worker, args=(params, gate, misses), processes=processes,
                      start_method="fork")
    seconds = time.perf_counter() - t0
    print(f"{processes} processes, {policy}: {UPDATES / seconds:.0f} updates/s")
    assert misses.sum().item() == 0
    assert report.status == "completed"
    assert report.applied == UPDATES == int(gate.state[G.VERSION])
    assert report.bound_violations == 0 and report.staleness_max == 0
    assert report.intervals == UPDATES
    assert report.left == 0 and report.workers == processes
    assert params[0].item() == params[-1].item() == UPDATES
    assert torch.count_nonzero(params[1:-1]).item() == 0


def _sleep_on_the_gate(gate, out):
    t0 = time.monotonic()
    out[2] = 1  # what follows is the wait, compiled already (the parent called it)
    out[0] = int(S.wait_finished(gate.state, 10_000_000))  # sleeps until woken, 10 s at most
    out[1] = int((time.monotonic() - t0) * 1e3)


def wait_until_asleep_on_a_futex(pid: int, flag) -> None:
    """Until process `pid` has set `flag` and sleeps in the kernel on a futex
    (/proc/PID/wchan), 30 s at most: a stop before it sleeps would find it
    awake and prove nothing (a fixed 0.5 s was too short on a busy machine)."""
    wchan = Path(f"/proc/{pid}/wchan")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if flag.item() == 1:
            if not wchan.exists() or wchan.read_text() in ("", "0"):  # no wchan to read
                time.sleep(0.5)
                return
            if "futex" in wchan.read_text():
                return
        time.sleep(0.001)
    pytest.fail(f"process {pid} never fell asleep on the gate (wchan {wchan.read_text()!r})")


def test_a_wake_reaches_a_sleeper_in_another_process():
    """A process asleep on the gate's futex (10 s timeout) wakes at once
    when another process stops the gate: the state's futexes are shared
    ones (a private futex's wake would miss it and it would sleep 10 s)."""
    ctx = torch.multiprocessing.get_context("fork")
    gate = it.IntervalGate(4, workers=2, max_updates=10)
    assert not S.wait_finished(gate.state, 1)  # compiled here, before the fork
    out = torch.zeros(3, dtype=torch.int64).share_memory_()
    child = ctx.Process(target=_sleep_on_the_gate, args=(gate, out))
    child.start()
    wait_until_asleep_on_a_futex(child.pid, out[2])  # it cannot finish before the stop
    t0 = time.monotonic()
    gate.stop()
    child.join(30)
    assert child.exitcode == 0
    assert out[0].item() == 1
    assert time.monotonic() - t0 < 5.0, f"woken after {out[1].item()} ms"


def test_the_gate_state_is_shared_memory_with_shared_futexes():
    gate = it.IntervalGate(4, workers=2)
    assert gate.state[G.SHARED] == 1 and gate._state.is_shared()
    assert np.shares_memory(gate.state, gate._state.numpy())
