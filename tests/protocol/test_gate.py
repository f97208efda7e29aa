"""The gate (iasgd.protocol.gate): its protocol at the level of single atomic steps,
the compiled functions against the same code run as Python, threaded stress
with a moving y, and the small pieces (tickets, barrier).

The interleaving checker (tests/protocol/gate_model.py) runs the real worker loop and
gate functions as Python over model atomics, one atomic operation per step;
hypothesis picks which thread takes each step while a controller moves
Y_NEXT and M or stops the run, and every step is checked for the invariants
listed in gate_model's doc, liveness included.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from gate_model import Scenario, gate_namespace, run_scenario
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from iasgd.compiled import jit  # cached with iasgd's: these inline its gate and atomics
from iasgd.protocol import gate as G
from iasgd.protocol import workers as W
from iasgd.protocol.atomics import atomic_load, atomic_store, cpu_relax, sleep_us

# The mutation check (tests/protocol/mutants.py) raises the number of examples.
MODEL_EXAMPLES = int(os.environ.get("IASGD_MODEL_EXAMPLES", "300"))
model_settings = settings(max_examples=MODEL_EXAMPLES, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])


@st.composite
def scenarios(draw, algos=(W.INTERVAL,)):
    # sampled_from: hypothesis starts from the first value, so the simplest
    # example it tries already has two threads and intervals of two
    threads = draw(st.sampled_from((2, 3, 1)))
    action = st.one_of(st.tuples(st.just("y"), st.integers(1, 5)),
                       st.tuples(st.just("m"), st.integers(1, threads)))
    actions = draw(st.lists(action, max_size=4))
    if draw(st.integers(0, 9)) == 0:
        actions.insert(draw(st.integers(0, len(actions))), ("stop",))
    return Scenario(algo=draw(st.sampled_from(algos)),
                    policy=draw(st.sampled_from((G.WAIT, G.DROP))), threads=threads,
                    y=draw(st.sampled_from((2, 3, 1, 4))), quota=draw(st.integers(1, 6)),
                    epochs=draw(st.integers(1, 3)), actions=actions,
                    m0=draw(st.one_of(st.none(), st.integers(1, threads))))


def bursts(seed: int) -> list[int]:
    """A schedule of bursts: a thread choice repeated 1-12 times. Races need
    one thread to run several steps while another is paused at just the
    wrong one; hypothesis's own lists favour short, simple schedules, so it
    picks the seed of a random one instead (a failure names its seed)."""
    rng = np.random.default_rng(seed)
    return [int(c) for c, n in zip(rng.integers(0, 6, 60), rng.integers(1, 13, 60), strict=True)
            for _ in range(n)]


schedules = st.integers(0, 2**32 - 1).map(bursts)


@model_settings
@given(sc=scenarios(), choices=schedules)
def test_interval_protocol_in_every_interleaving(sc, choices):
    run_scenario(sc, choices)


@model_settings
@given(sc=scenarios(algos=(W.HOGWILD, W.ASYNC)), choices=schedules)
def test_unbounded_protocols_in_every_interleaving(sc, choices):
    run_scenario(sc, choices)


# ---------------------------------------------- the model is the compiled code

_CALLS = ("take_ticket", "return_ticket", "try_slot", "claim_slot", "begin_apply",
          "finish_apply", "settle", "settle_many", "allow", "set_active", "y_next",
          "request_stop", "generation", "read_version", "commit_step", "enter_interval",
          "sync_round_size", "settled", "crossed")


def _call(g, state, name, arg):
    fn = getattr(g, name)
    if name in ("claim_slot", "crossed"):
        return fn(state, arg % 3)
    if name in ("settle_many", "allow", "set_active"):
        return fn(state, arg)
    if name == "commit_step":
        return fn(state, arg % 3, arg % 2 == 0)
    if name == "enter_interval":
        return fn(state, False)
    if name == "sync_round_size":
        return fn(state, 3, arg)
    return fn(state)


@settings(max_examples=150, deadline=None)
@given(y=st.integers(1, 5), calls=st.lists(st.tuples(st.sampled_from(_CALLS),
                                                     st.integers(0, 9)), max_size=60))
def test_compiled_gate_matches_the_model(y, calls):
    """Single-threaded call sequences give the same returns and state arrays
    compiled as in the model (which runs the same source as Python)."""
    from gate_model import Scheduler

    model = gate_namespace(Scheduler(np.zeros(1, np.int64)))
    compiled_state, model_state = G.new_state(y, limit=4), G.new_state(y, limit=4)
    for name, arg in calls:
        if name == "y_next":
            compiled_state[G.Y_NEXT] = model_state[G.Y_NEXT] = arg % 5 + 1
            continue
        expected = _call(G, compiled_state, name, arg)
        got = _call(model, model_state, name, arg)
        assert got == expected, name
        np.testing.assert_array_equal(model_state, compiled_state, err_msg=name)


# ------------------------------------------------- real threads, y moving fast

STRESS_SEGMENT = 50_000


@jit
def _stress_worker(state, wid, wait, drop, spin, out):
    """The worker loop's protocol (iasgd.protocol.workers.async_worker) with a spin
    for the gradient. out: [crossings or taus over y - 1, applied]."""
    bad = applied = 0
    while G.acquire_ticket(state, wid):
        gen = G.enter_interval(state, wait)
        if gen < 0:
            break
        v_read = G.read_version(state)
        for _ in range(spin):
            cpu_relax()
        if (v_read + wid) % 16 == 0:
            sleep_us(0)  # a system call now and then: the scheduler preempts here
        if not G.commit_step(state, gen, drop):
            G.return_ticket(state)
            continue
        tau = G.begin_apply(state) - v_read
        if G.crossed(state, gen) or tau > atomic_load(state, G.Y) - 1:
            bad += 1
        G.finish_apply(state)
        applied += 1
        G.settle(state)
    out[0] += bad
    out[1] += applied


@jit
def _move_y_and_m(state, low, high, seed, threads, moves_m, flag):
    """Controller: rewrite Y_NEXT as fast as it can (alternating low and high,
    or uniform in [low, high] when seed >= 0), and M now and then."""
    np.random.seed(max(seed, 0))
    i = 0
    while atomic_load(flag, 0) == 0:
        y = (low if i % 2 == 0 else high) if seed < 0 else np.random.randint(low, high + 1)
        atomic_store(state, G.Y_NEXT, y)
        if moves_m and i % 4096 == 0:
            G.set_active(state, 1 + (i // 4096) % threads)
        i += 1


def stress(policy, low, high, updates, threads=4, seed=-1, moves_m=False, spin=20):
    """Run `threads` stress workers for `updates` applied updates while the
    controller moves y (and M); returns (violations, applied, state)."""
    state = G.new_state(low)
    out, flag = np.zeros((threads, 2), np.int64), np.zeros(1, np.int64)
    wait, drop = policy == "wait", policy == "drop"
    workers = [threading.Thread(target=_stress_worker,
                                args=(state, wid, wait, drop, spin, out[wid]))
               for wid in range(threads)]
    controller = threading.Thread(target=_move_y_and_m,
                                  args=(state, low, high, seed, threads, moves_m, flag))
    controller.start()
    for t in workers:
        t.start()
    for limit in range(STRESS_SEGMENT, updates + 1, STRESS_SEGMENT):
        G.allow(state, limit)  # epochs: the workers sleep at each boundary
        while not G.wait_settled(state, 1_000_000):
            pass
    G.request_stop(state)
    for t in workers:
        t.join(60)
        assert not t.is_alive()
    flag[0] = 1
    controller.join(10)
    return int(out[:, 0].sum()), int(out[:, 1].sum()), state


@pytest.fixture(scope="module")
def compiled_stress():
    stress("wait", 2, 9, STRESS_SEGMENT, threads=1)  # compile before timing anything


@pytest.mark.parametrize("policy", ["wait", "drop"])
@pytest.mark.parametrize(("low", "high", "seed", "moves_m"), [
    (2, 9, -1, False),  # the reproduction: y toggling 2 <-> 9
    (1, 64, 7, False),  # y uniform in [1, 64]
    (2, 9, -1, True),  # and M moving between 1 and 4
])
def test_moving_y_keeps_every_update_in_its_interval(compiled_stress, policy, low, high, seed,
                                                     moves_m):
    updates = 200_000
    bad, applied, state = stress(policy, low, high, updates, seed=seed, moves_m=moves_m)
    assert bad == 0
    assert applied == updates == state[G.DONE] == state[G.VERSION] == state[G.TICKETS]
    assert low <= state[G.Y_MAX] <= high


def test_new_state_rejects_y_below_one():
    with pytest.raises(ValueError, match=r"y must be in \[1, 2147483647\], got 0"):
        G.new_state(0)
    with pytest.raises(ValueError, match="got 2147483648000"):
        G.new_state(2**31 * 1000)


def test_tickets_stop_at_the_limit_and_on_stop():
    state = G.new_state(4, limit=2)
    assert G.take_ticket(state) and G.take_ticket(state)
    assert not G.take_ticket(state)
    G.return_ticket(state)
    assert G.take_ticket(state)
    state[G.LIMIT] = 10
    G.request_stop(state)
    assert not G.take_ticket(state)
    assert G.wait_for_slot(state) >= 0  # a free slot is still handed out ...
    state[G.GEN_TAKEN] = 4  # ... but with all four taken, a stopped run does not wait
    assert G.wait_for_slot(state) == -1


def run_parties(party, parties: int) -> None:
    """party(i) on its own thread for i < parties; each must end within 30 s."""
    threads = [threading.Thread(target=party, args=(i,)) for i in range(parties)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
        assert not t.is_alive()


def test_barrier_releases_all_parties():
    state = G.new_state()
    parties, rounds = 3, 50
    passed = np.zeros(parties, np.int64)

    def party(i):
        sense = 0
        for _ in range(rounds):
            sense = 1 - sense
            assert G.barrier(state, parties, sense)
            passed[i] += 1

    run_parties(party, parties)
    assert passed.tolist() == [rounds] * parties


def test_a_stop_cancels_a_sync_round_for_every_party():
    """The last party to arrive decides: with a stop set meanwhile, every
    party is told 0 (apply nothing), never some 1 and some 0."""
    state = G.new_state()
    parties = 3
    answers = np.full(parties, 9, np.int64)
    arrived = threading.Barrier(parties - 1)

    def party(i):
        if i == parties - 1:  # the last one, after the stop
            while state[G.BARRIER_COUNT] < parties - 1:
                pass
            G.request_stop(state)
        else:
            arrived.wait()
        answers[i] = G.barrier(state, parties, 1)

    run_parties(party, parties)
    assert answers.tolist() == [0, 0, 0]
