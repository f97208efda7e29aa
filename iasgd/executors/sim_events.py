"""The simulator's event loop (iasgd.executors.simulated): n workers on
`cores` simulated cores, each making the threads' compiled calls one step at
a time, and a queue of events that says when each call happens.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from iasgd.algorithms import ALGORITHMS, POLICIES
from iasgd.config import TrainConfig
from iasgd.data import Dataset
from iasgd.executors.arrays import WorkerArrays
from iasgd.executors.sim_costs import Costs, forward_positions
from iasgd.nn.models import Model
from iasgd.protocol import gate as G
from iasgd.protocol import workers as W
from iasgd.results import Status
from iasgd.schedules import MONITOR_SECONDS, Controllers

EPS = 1e-12  # seconds: less than this left of a phase or a slice is nothing
# What a worker is at, in the order of a step: no ticket; a ticket, its slot
# and read not made yet; async's locked copy; forward and backward; computed,
# waiting to apply (async: for the lock); writing its update.
IDLE, START, READ, COMPUTE, APPLY_WAIT, APPLY = range(6)


@dataclass
class _Worker:
    phase: int = IDLE
    remaining: float = 0.0  # CPU seconds left in the current phase
    compute_s: float = 0.0  # the COMPUTE phase's length, drawn at the read
    cold: float = 0.0  # switch seconds at the head of `remaining`, not burnt yet
    switched: bool = False  # its step has been charged its switch
    gen: int = 0
    v_read: int = 0
    slice_left: float = 0.0  # of its time slice, while it has a core
    since: float = 0.0  # when its current run on a core (or spin) began
    token: int = 0  # its queued event is void unless it carries this token
    spinning: bool = False  # on a core, waiting for the lock's running holder


class Simulation(WorkerArrays):
    """The event loop, on the workers' arrays (iasgd.executors.arrays).

    A core runs a worker for a time slice of `quantum` seconds; a worker
    that finishes its step inside its slice goes straight on with the next
    one (as under the OS scheduler), otherwise it queues again at the back.
    A step is a sequence of phases (IDLE .. APPLY); each phase with CPU time
    left is one event in the queue at its end or at the slice's end,
    whichever comes first. The compiled calls happen at phase boundaries:
    ticket at IDLE -> START, slot and read at START -> READ, gradient and
    apply at APPLY_WAIT -> APPLY (async: once it holds the lock)."""

    def __init__(self, model: Model, data: Dataset, cfg: TrainConfig,
                 step_time: Callable[[np.random.Generator], float], cores: int, quantum: float,
                 control: Controllers, params: np.ndarray, costs: Costs,
                 on_tick: Callable[[], None]):
        # steps run one at a time: one workspace, and every read is a copy
        super().__init__(model, data, cfg, params, control, one_workspace=True)
        self.seed_streams(cfg.seed, 0)
        self.step_time, self.cores, self.quantum = step_time, cores, quantum
        self.costs, self.on_tick = costs, on_tick
        self.switch_s = costs.switch_s if math.isfinite(quantum) else 0.0
        algo = ALGORITHMS[cfg.algo]
        self.rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, 3]))  # step times
        self.slice_rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, 4]))
        self.workers = [_Worker() for _ in range(cfg.threads)]
        self.runnable: deque[int] = deque()
        self.waiting: deque[int] = deque()  # wait gate: holding a ticket, no slot
        self.parked: list[int] = []  # outside the active thread count m
        self.on_core: set[int] = set()
        self.events: list[tuple[float, int, int, int]] = []  # (time, seq, worker, token)
        self.free_cores = cores
        self.seq = 0
        self.now = 0.0
        self.budget = cfg.time_budget if cfg.time_budget is not None else math.inf
        self.next_tick = 0.0
        self.stop: Status | None = None
        self.waits_for_slot = algo.bound == "interval" and POLICIES[cfg.gate].code == G.WAIT
        self.sync = algo.loop == "sync"
        # the copy a locked read makes (read_s) holds the lock; the lock
        # matters only if it is held for some time
        self.read_s = costs.read_s if algo.locked else 0.0
        self.locks = algo.locked and (costs.read_s > 0 or costs.apply_s > 0)
        self.holder: int | None = None
        self.spinners: deque[int] = deque()
        self.live = costs.live_reads and not algo.snapshot
        self.positions = forward_positions(model) if self.live else []

    def applied(self) -> int:
        return int(self.counters[:, W.APPLIED].sum())

    def stop_run(self, why: Status) -> None:
        """Stop the run (`why`: the first reason is kept) as the threads'
        monitor does, with G.request_stop: no new step starts, the ones
        under way finish and apply, and each worker waiting for a slot
        wakes and leaves (leave_interval)."""
        if self.stop is None:
            self.stop = why
        G.request_stop(self.state)
        for w in self.waiting:
            self.leave_interval(w)
        self.waiting.clear()

    def leave_interval(self, w: int) -> None:
        """Worker w, holding a ticket and no slot, finds the run stopped:
        G.enter_interval, as a waiting thread wakes into it, returns -1 and
        gives the ticket back."""
        gen = G.enter_interval(self.state, True)
        assert gen < 0, "a stopped run's waiter found a free slot"
        self.workers[w].phase = IDLE

    # ---- a worker's step: the calls async_worker makes, one at a time

    def start_step(self, w: int) -> bool:
        """Take a ticket for the worker's next step (phase START); False: the
        run is stopping (the time budget is checked here, as a worker checks
        its deadline before each step), none is left, or the worker is
        parked (outside the active count m)."""
        if self.now >= self.budget:
            self.stop_run(Status.TIME_BUDGET)
        if self.stop is not None:
            return False
        if w >= self.state[G.M]:
            self.parked.append(w)
            return False
        if not G.take_ticket(self.state):
            return False
        self.workers[w].phase = START
        return True

    def begin(self, w: int) -> bool:
        """The step's first CPU time: its slot (wait gate) or async's lock,
        then the read and the step's duration. False: it waits (for a slot,
        off the cores; for the lock, see take_lock) or leaves (no slot and
        the run stopping: its ticket goes back)."""
        wk = self.workers[w]
        if self.waits_for_slot:
            gen = int(G.try_slot(self.state))
            if gen < 0:
                self.leave_core(w)
                if self.stop is not None:
                    self.leave_interval(w)
                else:
                    self.waiting.append(w)
                return False
        else:
            gen = int(G.generation(self.state))
        if self.locks and not self.take_lock(w):
            return False
        wk.gen, wk.switched = gen, False
        wk.v_read = int(W.read_step(self.rule, self.shared, self.inputs, self.own[w], True,
                                    self.augment))
        drawn = self.step_time(self.rng) * (1.0 + self.costs.contention * (self.busy() - 1))
        wk.compute_s = max(drawn - self.costs.apply_s, 0.0)
        self.set_phase(w, READ, self.read_s)
        return True

    def busy(self) -> int:
        """Cores computing while a step begins (it has its slot and is about
        to read): the steps under way, this one, and the queued workers
        about to begin theirs (at an epoch's start they are about to get
        their cores). Under the wait gate no more of those than the open
        interval has slots left: the waiters an opening interval wakes and
        that find it full go back to sleep without computing."""
        under_way = sum(self.workers[v].phase >= READ for v in self.on_core)
        under_way += sum(self.workers[v].phase >= READ for v in self.runnable)
        about = sum(self.workers[v].phase < READ for v in self.runnable)
        if self.waits_for_slot:
            about = min(about, int(G.slots_left(self.state)))
        return min(self.cores, under_way + 1 + about)

    def complete(self, w: int) -> None:
        """The gradient at the worker's read and its commit and apply (the
        workers share one workspace, so the gradient is computed here, right
        before the apply that uses it)."""
        wk, own = self.workers[w], self.own[w]
        W.gather_batch(self.inputs, own, self.augment)
        loss = W.compute_step(self.rule, self.shared, own, own.local, self.knobs)
        if W.apply_step(wk.gen, wk.v_read, loss, self.rule, self.shared, own, self.knobs) < 0:
            self.stop_run(Status.DIVERGED)
        elif self.waits_for_slot and self.state[G.GEN_TAKEN] & 0xFFFFFFFF == 0:
            self.runnable.extend(self.waiting)  # an interval opened: they try for a slot
            self.waiting.clear()

    def set_phase(self, w: int, phase: int, seconds: float) -> None:
        wk = self.workers[w]
        wk.phase, wk.remaining, wk.cold = phase, seconds, 0.0

    def advance(self, w: int) -> bool:
        """Worker w, on a core, is done with its phase: make the calls due and
        enter the next phase. False: it left its core or spins."""
        wk = self.workers[w]
        if wk.phase == IDLE:
            if not self.start_step(w):
                self.leave_core(w)
                return False
            return True
        if wk.phase == START:
            if wk.slice_left <= EPS:  # the read waits for its next core time
                self.preempt(w)
                return False
            return self.begin(w)
        if wk.phase == READ:
            self.release_lock(w)
            self.set_phase(w, COMPUTE, wk.compute_s)
        elif wk.phase == COMPUTE:
            self.set_phase(w, APPLY_WAIT, 0.0)
        elif wk.phase == APPLY_WAIT:
            if self.locks and not self.take_lock(w):
                return False
            self.complete(w)
            self.set_phase(w, APPLY, self.costs.apply_s)
        else:  # APPLY
            self.release_lock(w)
            wk.phase = IDLE
        return True

    def proceed(self, w: int) -> None:
        """Run worker w, which has a core, until it leaves it or an event of
        its own is queued (its phase or its slice ends then)."""
        wk = self.workers[w]
        while True:
            if wk.remaining > EPS:
                if wk.slice_left <= EPS:
                    self.preempt(w)
                else:
                    self.schedule(w, min(wk.slice_left, wk.remaining))
                return
            if not self.advance(w):
                return

    # ---- async's lock: held through the copy and through the write

    def take_lock(self, w: int) -> bool:
        """True if w holds the lock now. Otherwise, as G.lock's backoff does:
        while the holder runs, w spins on its core (until the lock is free
        or w's slice ends); while the holder has no core, w yields its core
        and tries again when it gets one back."""
        if self.holder is None or self.holder == w:
            self.holder = w
            return True
        wk = self.workers[w]
        if self.holder in self.on_core:
            wk.spinning = True
            self.spinners.append(w)
            self.schedule(w, wk.slice_left)
        else:
            self.preempt(w)
        return False

    def release_lock(self, w: int) -> None:
        """w lets the lock go; the first spinner takes it and goes on."""
        if self.holder != w:
            return
        self.holder = None
        if self.spinners:
            s = self.spinners.popleft()
            sk = self.workers[s]
            sk.slice_left -= self.now - sk.since
            sk.spinning, sk.token = False, sk.token + 1  # its slice's end is void
            self.holder = s
            self.proceed(s)

    # ---- the monitor

    def tick(self) -> None:
        """Every MONITOR_SECONDS of simulated time: the monitor's tick
        (on_tick: iasgd.executors.base's, as on threads), then the parked
        workers that the active count m now lets in start a step."""
        self.next_tick = self.now + MONITOR_SECONDS
        self.on_tick()
        woken = [w for w in self.parked if w < self.state[G.M]]
        self.parked = [w for w in self.parked if w >= self.state[G.M]]
        self.runnable.extend(w for w in woken if self.start_step(w))

    # ---- cores and time slices

    def schedule(self, w: int, seconds: float) -> None:
        """Queue w's next event `seconds` from now (voiding any earlier one)."""
        wk = self.workers[w]
        wk.since, wk.token, self.seq = self.now, wk.token + 1, self.seq + 1
        heapq.heappush(self.events, (self.now + seconds, self.seq, w, wk.token))

    def leave_core(self, w: int) -> None:
        self.on_core.discard(w)
        self.free_cores += 1

    def preempt(self, w: int) -> None:
        """w gives its core up (its slice ended, or it yields) and queues at
        the back. If it holds the lock, its spinners yield too."""
        self.leave_core(w)
        self.runnable.append(w)
        if self.holder == w:
            while self.spinners:
                s = self.spinners.popleft()
                sk = self.workers[s]
                sk.slice_left -= self.now - sk.since
                sk.spinning, sk.token = False, sk.token + 1
                self.preempt(s)

    def on_event(self, w: int) -> None:
        """Worker w's queued event is due: its phase or its slice ended."""
        wk = self.workers[w]
        ran = self.now - wk.since
        wk.slice_left -= ran
        if wk.spinning:  # its slice ran out while it spun for the lock
            wk.spinning = False
            self.spinners.remove(w)
            self.preempt(w)
            return
        wk.remaining -= ran
        wk.cold = max(wk.cold - ran, 0.0)
        self.proceed(w)

    def next_slice(self) -> float:
        """How long the slice a worker gets now lasts (s)."""
        spread = self.costs.slice_spread
        if not spread or not math.isfinite(self.quantum):
            return self.quantum
        return self.quantum * float(self.slice_rng.uniform(1.0 - spread, 1.0 + spread))

    def dispatch(self) -> None:
        """Give free cores to the queued workers, front first."""
        while self.free_cores and self.runnable:
            w = self.runnable.popleft()
            wk = self.workers[w]
            self.free_cores -= 1
            self.on_core.add(w)
            wk.slice_left = self.next_slice()
            if wk.remaining > EPS:  # back to a step cut by its slice: its caches are cold
                if self.live and wk.phase == COMPUTE:
                    left = wk.remaining - wk.cold  # of the step's own compute
                    self.read_rest(w, 1.0 - left / max(wk.compute_s, EPS))
                if not wk.switched:  # once a step: a switch longer than a slice still ends
                    wk.switched = True
                    wk.remaining += self.switch_s
                    wk.cold += self.switch_s
            self.proceed(w)

    def read_rest(self, w: int, done: float) -> None:
        """Live reads: worker w resumes its step with a share `done` of its
        compute made; the layers its forward pass has not reached yet are
        read now, as they stand (into its row of `local`: (P,))."""
        for offset, at in self.positions:
            if at >= done:
                self.local[w, offset:] = self.params[offset:]
                return

    def run_until(self, limit: int) -> None:
        """Allow updates up to `limit` applied since the start and run until
        every one is applied or the run stopped and every step under way has
        finished (as the threads do at an epoch's end or an eval_every
        boundary, and at a stop)."""
        G.allow(self.state, limit)
        if self.sync:
            self.run_sync_rounds(limit)
            return
        self.parked.clear()  # every worker starts afresh (or parks again)
        self.runnable.extend(w for w in range(self.cfg.threads)
                             if self.workers[w].phase == IDLE and self.start_step(w))
        self.dispatch()
        while self.events:
            at, _, w, token = heapq.heappop(self.events)
            if token != self.workers[w].token:
                continue  # voided (w left that run early): no time passes for it
            self.now = at
            if self.now >= self.next_tick:
                self.tick()
            self.on_event(w)
            self.dispatch()

    def run_sync_rounds(self, limit: int) -> None:
        """Sync: rounds of up to n gradients on the same parameters, averaged
        into one update. A round lasts max(longest step, total / cores): the
        time n time-sliced steps take on the cores. Each worker checks the
        deadline before its gradient, and one that finds it passed cancels
        the round: a round whose last step begins after the time budget is
        not applied (its last step begins a longest step before its end).

        The rounds of iasgd.protocol.workers.sync_worker, one worker after
        another: that loop needs its n threads at once (they meet at its
        barriers), so it cannot be called one step at a time. The calls are
        its own (round_gradient, apply_round over all columns, record_update,
        then VERSION and settle_many as its worker 0 does), so the parameters
        are the threads' to the bit (tests/executors/test_simulated.py)."""
        P = self.params.size
        while self.applied() < limit and self.stop is None:
            active = min(self.cfg.threads, limit - self.applied())
            slow = 1.0 + self.costs.contention * (min(active, self.cores) - 1)
            steps = [self.step_time(self.rng) * slow for _ in range(active)]
            round_s = max(max(steps), sum(steps) / self.cores)
            if self.now + round_s - max(steps) >= self.budget:
                self.now = max(self.now, self.budget)
                self.stop_run(Status.TIME_BUDGET)
                break
            losses = [W.round_gradient(self.rule, self.shared, self.inputs, self.own[w],
                                       self.grads[w], self.augment, self.knobs)
                      for w in range(active)]
            if not all(math.isfinite(loss) for loss in losses):
                self.stop_run(Status.DIVERGED)
                break
            W.apply_round(self.rule, self.shared, self.grads, active, int(self.state[G.DONE]), 0, P,
                          self.own[0].grad, self.knobs)
            for w, loss in enumerate(losses):
                W.record_update(self.own[w], self.shared, 0, loss)
            self.state[G.VERSION] += 1
            G.settle_many(self.state, active)
            self.now += round_s
            if self.now >= self.next_tick:
                self.tick()
