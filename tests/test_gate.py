"""The interval gate.

A hypothesis state machine drives the real (compiled) gate functions through
random interleavings of begin / commit / apply from k simulated workers, for
random y (changed between intervals too) and both policies, and checks after
every step: tau <= y - 1 of the interval the update was applied in; every
completed interval holds exactly its y updates; no update read in an earlier
interval is applied; the counters agree with a plain Python model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from iasgd import gate as G

IDLE, COMPUTING, CLAIMED, APPLYING = "idle", "computing", "claimed", "applying"


@dataclass
class SimWorker:
    phase: str = IDLE
    gen: int = -1
    v_read: int = -1


class GateMachine(RuleBasedStateMachine):
    @initialize(y=st.integers(1, 9), k=st.integers(1, 6), policy=st.sampled_from(G.POLICIES))
    def setup(self, y, k, policy):
        self.policy = policy
        self.state = G.new_state(y, limit=10**9)
        self.workers = [SimWorker() for _ in range(k)]
        self.y_of = {0: y}  # generation -> its interval size
        self.applied_in = {0: 0}  # generation -> updates applied in it
        self.applied = self.dropped = 0
        self.taus: list[int] = []

    def gen_now(self) -> int:
        return int(G.generation(self.state))

    @rule(w=st.integers(0, 5))
    def advance(self, w):
        """Move worker w one phase on: begin, commit, begin_apply, finish_apply."""
        wk = self.workers[w % len(self.workers)]
        {IDLE: self.begin, COMPUTING: self.commit, CLAIMED: self.apply_begin,
         APPLYING: self.apply_finish}[wk.phase](wk)

    def begin(self, wk):
        if not G.take_ticket(self.state):
            return
        if self.policy == "wait":
            gen = int(G.try_slot(self.state))
            if gen < 0:  # no slot: a real worker would wait; give the ticket back
                G.return_ticket(self.state)
                return
        else:
            gen = self.gen_now()
        wk.phase, wk.gen, wk.v_read = COMPUTING, gen, int(self.state[G.VERSION])

    def commit(self, wk):
        if self.policy == "drop" and not G.claim_slot(self.state, wk.gen):
            assert wk.gen != self.gen_now() or self.taken() >= self.y_of[wk.gen]
            G.return_ticket(self.state)
            self.dropped += 1
            wk.phase = IDLE
            return
        wk.phase = CLAIMED

    def apply_begin(self, wk):
        assert wk.gen == self.gen_now(), "an update read in an earlier interval got applied"
        tau = int(G.begin_apply(self.state)) - wk.v_read
        assert 0 <= tau <= self.y_of[wk.gen] - 1
        self.taus.append(tau)
        wk.phase = APPLYING

    def apply_finish(self, wk):
        gen = self.gen_now()
        self.applied_in[gen] += 1
        self.applied += 1
        opened = G.finish_apply(self.state)
        assert opened == (self.applied_in[gen] == self.y_of[gen])
        if opened:
            assert self.gen_now() == gen + 1
            self.y_of[gen + 1] = int(self.state[G.Y])
            self.applied_in[gen + 1] = 0
        wk.phase = IDLE

    @precondition(lambda self: hasattr(self, "state"))
    @rule(y=st.integers(1, 9))
    def controller_sets_next_y(self, y):
        self.state[G.Y_NEXT] = y

    def taken(self) -> int:
        return int(self.state[G.GEN_TAKEN] & 0xFFFFFFFF)

    @precondition(lambda self: hasattr(self, "state"))
    @invariant()
    def counters_agree_with_the_model(self):
        gen = self.gen_now()
        y = self.y_of[gen]
        assert int(self.state[G.Y]) == y
        assert 0 <= self.state[G.APPLIED] == self.applied_in[gen] <= self.taken() <= y
        for g in range(gen):  # every completed interval holds exactly its y updates
            assert self.applied_in[g] == self.y_of[g]
        assert int(self.state[G.INTERVALS]) == gen
        assert int(self.state[G.VERSION]) == self.applied + sum(
            w.phase == APPLYING for w in self.workers)
        holding = sum(w.phase != IDLE for w in self.workers)
        assert int(self.state[G.TICKETS]) == self.applied + holding
        assert self.state[G.TICKETS] <= self.state[G.LIMIT]
        if self.policy == "wait":
            # a slot is taken at begin: the slots of this interval are held by
            # workers in flight or already applied
            in_gen = sum(w.phase != IDLE and w.gen == gen for w in self.workers)
            assert self.taken() == self.applied_in[gen] + in_gen


TestGateMachine = GateMachine.TestCase
TestGateMachine.settings = settings(max_examples=200, stateful_step_count=100, deadline=None)


def test_new_state_rejects_y_below_one():
    import pytest

    with pytest.raises(ValueError, match="y must be >= 1"):
        G.new_state(0)


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


def test_barrier_releases_all_parties():
    import threading

    state = G.new_state()
    parties, rounds = 3, 50
    passed = np.zeros(parties, np.int64)

    def party(i):
        sense = 0
        for _ in range(rounds):
            sense = 1 - sense
            assert G.barrier(state, parties, sense)
            passed[i] += 1

    threads = [threading.Thread(target=party, args=(i,)) for i in range(parties)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
        assert not t.is_alive()
    assert passed.tolist() == [rounds] * parties
