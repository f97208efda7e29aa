"""The simulated executor: the staleness of n workers, on one core.

It runs the algorithms' steps exactly as the threads do, through the same
compiled calls (iasgd.protocol.gate for tickets, slots and intervals; iasgd.protocol.workers'
read_step, compute_step, apply_step, and sync's round_gradient and
apply_round; the same counters, histograms and loss ring; the same epoch
loop, evaluation points, epoch recorder and run summary), and decides only
*when* each step happens, from a model of time: every step of a worker
takes a duration drawn from a step-time distribution (lognormal with a
given spread, or samples measured from real single-thread steps), and n
workers share `cores` cores in round-robin time slices of `quantum` seconds
(with a core per worker they simply run side by side). What the machine
adds is `Costs`: contention between busy cores, cold caches after a switch,
async's lock held through its copy and its write, and live reads (a
Hogwild! step cut by its slice reads the layers it has not reached when it
resumes). sync: a round lasts max(longest step, total / cores), barrier
costs not modelled. Epoch ends and eval_every boundaries drain the steps
under way, as on threads; the time budget is checked before each step, so
the steps under way at it finish and apply. The schedules steer every
MONITOR_SECONDS of simulated time. Nothing it reports was measured on n
real cores: every output says "simulated". docs/simulator.md has the model
and its parameters.

Each worker owns its random stream, as on threads: one simulated worker on a
core draws the same batches, and so trains to the same parameters, as one
real thread.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from iasgd.algorithms import ALGORITHMS
from iasgd.config import TrainConfig, check_data, steps_per_epoch
from iasgd.data import Dataset
from iasgd.executors.arrays import WorkerArrays
from iasgd.executors.epochs import run_epochs, train_in_chunks
from iasgd.nn import kernels as K
from iasgd.nn.blas import single_threaded_blas
from iasgd.nn.models import Model
from iasgd.protocol import gate as G
from iasgd.protocol import workers as W
from iasgd.results import Hooks, RunResult, Status, record_epoch, record_eval, summarize
from iasgd.schedules import MONITOR_SECONDS, Controllers

SIMULATED_ALGOS = tuple(a.name for a in ALGORITHMS.values() if a.simulated)


def lognormal_steps(mean_s: float, spread: float) -> Callable[[np.random.Generator], float]:
    """Step durations with mean `mean_s` seconds and sigma `spread` of log-time."""
    mu = math.log(mean_s) - spread**2 / 2
    return lambda rng: float(rng.lognormal(mu, spread))


def measured_steps(samples: np.ndarray) -> Callable[[np.random.Generator], float]:
    """Step durations drawn from measured ones (seconds)."""
    return lambda rng: float(samples[rng.integers(samples.size)])


def measure_step_times(model: Model, data: Dataset, batch_size: int,
                       steps: int = 200) -> np.ndarray:
    """Durations (s) of `steps` real single-thread training steps, after
    warm-up, less what a call from Python costs (typing and unboxing its
    arguments, the median of as many calls of no step): real workers run
    their steps inside one compiled loop and never pay it."""
    ws = model.workspace(batch_size)
    params = model.init(0)
    velocity = np.zeros_like(params)
    images = data.x_train.reshape(data.x_train.shape[0], -1)
    order = np.arange(images.shape[0], dtype=np.int64)
    per_epoch = images.shape[0] // batch_size
    losses = np.zeros(per_epoch)
    times, calls = np.empty(steps), np.empty(steps)
    with single_threaded_blas():  # as the workers run
        for s in range(steps + 1):  # round 0 is the warm-up
            for n, out in ((1, times), (0, calls)):
                t0 = time.perf_counter()
                K.train_steps(K.Weights(params, velocity), ws.buffers,
                              K.Images(images, data.y_train, *model.image_transform),
                              K.Steps(order, s % per_epoch, n, batch_size, 0.0, 0.0), losses)
                if s:
                    out[s - 1] = time.perf_counter() - t0
    return np.maximum(times - float(np.median(calls)), 1e-6)


def measure_sections(model: Model, repeats: int = 200) -> tuple[float, float]:
    """CPU seconds of (async's copy of the P parameters into its snapshot,
    one update's write: momentum and parameters) on this machine, the medians
    of `repeats` timings after a warm-up; the critical sections of Costs."""
    params = model.init(0)
    local, velocity, grad = np.zeros_like(params), np.zeros_like(params), np.zeros_like(params)
    copy, write = np.empty(repeats), np.empty(repeats)
    for i in range(repeats + 1):  # round 0 is the warm-up
        t0 = time.perf_counter()
        local[:] = params
        t1 = time.perf_counter()
        K.sgd_momentum_update(params, velocity, grad, 0.0, 0.0)
        t2 = time.perf_counter()
        if i:
            copy[i - 1], write[i - 1] = t1 - t0, t2 - t1
    return float(np.median(copy)), float(np.median(write))


@dataclass(frozen=True)
class Costs:
    """What the machine adds to the drawn single-thread step times, and how
    a step reads (docs/simulator.md, "What it models"); seconds are CPU
    seconds of the worker's core. The default: steps take exactly their
    drawn time and async's lock is never waited for, so async and hogwild
    differ only in what a cut step reads.

    contention: a step that begins while k cores compute steps (itself
        included; _Sim.busy) takes (1 + contention * (k - 1)) times its drawn time:
        what the cores cost each other on the shared array (its cache
        lines move between cores) and in memory bandwidth.
    switch_s: CPU time a time-sliced worker spends again when it gets a
        core back for a step that the end of its slice cut (its caches went
        cold while the others ran); once per step, so that a switch longer
        than a slice still lets the step end; never charged when every
        worker has its own core.
    read_s: async's copy of the parameters, made holding the lock (not in
        the drawn step time: a single-thread step copies nothing).
    apply_s: the update's write, the last apply_s of the drawn step time
        (async: holding the lock).
    live_reads: hogwild and interval read the shared array as they compute
        (no snapshot; async copies it under its lock): a step cut by the
        end of its slice reads, when it resumes, the current values of the
        layers its forward pass has not reached yet (forward_positions).
        Off: the whole read is the snapshot taken when the step began
        (what the simulator did before issue 22).
    slice_spread: the scheduler's slices are not all one quantum long (a
        slice ends at a timer tick after the thread's share is used, other
        threads' wake-ups cut it): each lasts quantum * U(1 - s, 1 + s).
        0: every slice is exactly one quantum.
    """

    contention: float = 0.0
    switch_s: float = 0.0
    read_s: float = 0.0
    apply_s: float = 0.0
    live_reads: bool = True
    slice_spread: float = 0.0


FORWARD_SHARE = 1 / 3  # of a step's compute: the backward pass costs about twice the forward


def forward_positions(model: Model) -> list[tuple[int, float]]:
    """(offset of a layer's first parameter, when the forward pass reads it
    as a share of the step's compute in [0, FORWARD_SHARE)) for each layer
    with parameters, in order: the forward pass reaches each layer after
    the multiply-adds of the layers before it (conv: out * h * w * in * k *
    k; dense: out * in; the others about one per output)."""
    offsets = {name: off for name, _, off in model.layout}
    work, marks = 0.0, []
    for ls in model.shapes:
        if ls.params:
            marks.append((offsets[ls.params[0][0]], work))
        weight = ls.params[0][1] if ls.params else ()
        work += float(np.prod(ls.shape)) * (float(np.prod(weight[1:])) if weight else 1.0)
    return [(off, FORWARD_SHARE * done / work) for off, done in marks]


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


class _Sim(WorkerArrays):
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
                 result: RunResult, params: np.ndarray, costs: Costs):
        quota = steps_per_epoch(data.x_train.shape[0], cfg.batch_size)
        control = Controllers(cfg, quota, result, cores=cores)
        # steps run one at a time: one workspace, and every read is a copy
        super().__init__(model, data, cfg, params, control, one_workspace=True)
        self.seed_streams(cfg.seed, 0)
        self.cfg, self.step_time, self.cores, self.quantum = cfg, step_time, cores, quantum
        self.costs = costs
        self.switch_s = costs.switch_s if math.isfinite(quantum) else 0.0
        self.result, self.quota, self.control = result, quota, control
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
        self.waits_for_slot = ALGORITHMS[cfg.algo].bound == "interval" and cfg.gate == "wait"
        # async's lock matters only if it is held for some time
        self.locks = cfg.algo == "async" and (costs.read_s > 0 or costs.apply_s > 0)
        self.holder: int | None = None
        self.spinners: deque[int] = deque()
        self.live = costs.live_reads and not ALGORITHMS[cfg.algo].snapshot
        self.positions = forward_positions(model) if self.live else []

    def applied(self) -> int:
        return int(self.counters[:, W.APPLIED].sum())

    def stop_run(self, why: Status) -> None:
        """What request_stop does to the workers: no new step starts, the
        ones under way finish and apply, and a worker waiting for a slot
        gives its ticket back and leaves."""
        if self.stop is None:
            self.stop = why
        for w in self.waiting:
            G.return_ticket(self.state)
            self.workers[w].phase = IDLE
        self.waiting.clear()

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
                if self.stop is not None:  # enter_interval gives the ticket back
                    G.return_ticket(self.state)
                    wk.phase = IDLE
                else:
                    self.waiting.append(w)
                return False
        else:
            gen = int(G.generation(self.state))
        if self.locks and not self.take_lock(w):
            return False
        wk.gen, wk.switched = gen, False
        wk.v_read = int(W.read_step(self.rule, self.shared, self.inputs, self.own[w], True))
        drawn = self.step_time(self.rng) * (1.0 + self.costs.contention * (self.busy() - 1))
        wk.compute_s = max(drawn - self.costs.apply_s, 0.0)
        self.set_phase(w, READ, self.costs.read_s if self.cfg.algo == "async" else 0.0)
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
        W.gather_batch(self.inputs, own)
        loss = W.compute_step(self.shared, own, own.local)
        if W.apply_step(wk.gen, wk.v_read, loss, self.rule, self.shared, own) < 0:
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

    # ---- the schedules

    def steer(self) -> None:
        """What the threads' monitor does every MONITOR_SECONDS: check the
        parameters and the time budget, let the schedules steer, wake
        workers that m lets in."""
        self.next_tick = self.now + MONITOR_SECONDS
        if not K.all_finite(self.params):
            self.stop_run(Status.DIVERGED)
        if self.now >= self.budget:
            self.stop_run(Status.TIME_BUDGET)
        self.control.step(self.now, self.applied(), int(self.probe[W.LOSS_POS]), self.state,
                          self.lr_factors, self.staleness_so_far)
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
        if ALGORITHMS[self.cfg.algo].loop == "sync":
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
                self.steer()
            self.on_event(w)
            self.dispatch()

    def run_sync_rounds(self, limit: int) -> None:
        """Sync: rounds of up to n gradients on the same parameters, averaged
        into one update. A round lasts max(longest step, total / cores): the
        time n time-sliced steps take on the cores. Each worker checks the
        deadline before its gradient, and one that finds it passed cancels
        the round: a round whose last step begins after the time budget is
        not applied (its last step begins a longest step before its end)."""
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
            losses = [W.round_gradient(self.shared, self.inputs, self.own[w], self.grads[w])
                      for w in range(active)]
            if not all(math.isfinite(loss) for loss in losses):
                self.stop_run(Status.DIVERGED)
                break
            W.apply_round(self.rule, self.shared, self.grads, active, 0, P,
                          self.own[0].grad)
            for w, loss in enumerate(losses):
                W.record_update(self.own[w], self.shared, 0, loss)
            self.state[G.VERSION] += 1
            G.settle_many(self.state, active)
            self.now += round_s
            if self.now >= self.next_tick:
                self.steer()


class SimulatedRun:
    """The simulator as an Executor of iasgd.executors.epochs: epochs of
    simulated time, cut at eval_every boundaries as the threads' are (an
    evaluation costs no simulated time). Its runs are not checkpointed."""

    def __init__(self, model: Model, data: Dataset, cfg: TrainConfig,
                 step_time: Callable[[np.random.Generator], float], cores: int, quantum: float,
                 init: np.ndarray | None = None, costs: Costs | None = None):
        self.model, self.data, self.cfg = model, data, cfg
        self.result = RunResult(status=Status.COMPLETED)
        params = model.init(cfg.seed) if init is None else init.copy()
        self.sim = _Sim(model, data, cfg, step_time, cores, quantum, self.result, params,
                        costs or Costs())
        self.result.params = self.sim.params
        self.epoch = 1
        self.epoch_start = 0.0  # simulated seconds

    def epoch_samples(self) -> int:
        return self.sim.quota * self.cfg.batch_size

    def train_epoch(self, hooks: Hooks) -> int:
        sim, r = self.sim, self.result
        self.epoch_start, applied_before = sim.now, sim.applied()
        sim.steer()
        train_in_chunks(lambda: int(sim.state[G.DONE]), self.epoch * sim.quota,
                        self.cfg.eval_every, run_until=sim.run_until,
                        stopped=lambda: sim.stop is not None,
                        out_of_time=lambda: sim.stop == Status.TIME_BUDGET,
                        evaluate=self._evaluate_inside_epoch)
        if sim.stop is None and not K.all_finite(sim.params):
            sim.stop_run(Status.DIVERGED)
        applied = sim.applied() - applied_before
        if sim.stop == Status.DIVERGED:
            r.diverged_at = {"epoch": self.epoch, "step": applied + 1}
        if sim.stop is not None:
            r.status = sim.stop
        return applied

    def _evaluate_inside_epoch(self) -> bool:
        """At an eval_every boundary, every allowed update applied: the test
        accuracy into result.evals, at the simulated time (evaluating takes
        none of it). False if the parameters diverged."""
        sim = self.sim
        if not K.all_finite(sim.params):
            sim.stop_run(Status.DIVERGED)
            return False
        record_eval(self.result, self.model, self.data, sim.params, seconds=sim.now,
                    applied=int(sim.state[G.DONE]))
        return True

    def record_epoch(self, hooks: Hooks, applied: int) -> None:
        sim = self.sim
        if self.epoch == 1:
            sim.control.end_of_first_epoch(int(sim.probe[W.LOSS_POS]))
        hist, loss_sum = sim.end_epoch_stats()
        record = record_epoch(self.result, self.model, self.data, sim.params, epoch=self.epoch,
                              applied=applied, quota=sim.quota, batch_size=self.cfg.batch_size,
                              seconds=sim.now - self.epoch_start, loss_sum=loss_sum, hist=hist,
                              end_s=sim.now)
        if self.cfg.eval_every:
            record_eval(self.result, self.model, self.data, sim.params, seconds=sim.now,
                        applied=int(sim.state[G.DONE]), accuracy=record.test_accuracy)
        hooks.on_epoch_end(record)

    def next_epoch(self) -> None:
        self.epoch += 1

    def finish(self) -> None:
        sim, r = self.sim, self.result
        sim.control.logs()
        r.train_time_s = sim.now
        r.samples = sim.applied() * self.cfg.batch_size
        summarize(r, self.cfg.algo, sim.counters, sim.state, sim.run_hist, sim.probe)

    def snapshot(self) -> None:
        """Simulated runs are not checkpointed."""


def simulate(model: Model, data: Dataset, cfg: TrainConfig,
             step_time: Callable[[np.random.Generator], float], cores: int | None = None,
             quantum: float = 0.004, hooks: Hooks | None = None,
             init: np.ndarray | None = None, costs: Costs | None = None) -> RunResult:
    """Train as cfg says, with the staleness that cfg.threads workers on
    `cores` cores (default: one each) would produce under `step_time`, time
    slices of `quantum` seconds (with fewer cores than workers) and the
    machine's `costs` (default: none). Returns a RunResult whose wall times
    (and time budget) are simulated seconds. hooks: on_epoch_start and
    on_epoch_end are called (at simulated epoch ends); progress and stop
    requests are not. init: (P,) the starting parameters (default: the
    model's initialisation with cfg.seed)."""
    cfg.check()
    check_data(model, data, cfg)
    if cfg.algo not in SIMULATED_ALGOS:
        raise ValueError(f"the simulator covers --algo {', '.join(SIMULATED_ALGOS)}, "
                         f"not {cfg.algo}")
    if not quantum > 0:
        raise ValueError(f"the time slice must be positive, got {quantum} s")
    cores = cores or cfg.threads
    run = SimulatedRun(model, data, cfg, step_time, cores,
                       quantum if cores < cfg.threads else math.inf, init, costs)
    with single_threaded_blas():  # the kernels' GEMMs: one core each
        return run_epochs(run, hooks or Hooks())
