"""The cluster level: nodes, each a team of threads on its own machine, and
a parameter server that runs the same gate over the nodes' pushes. No Ray
here: iasgd.executors.ray_cluster places these objects on a Ray cluster, and the tests
drive them in one process.

A node trains its own copy of the parameters with cfg.threads threads and
cfg.algo, exactly as on one machine (iasgd.executors.threads.Team). Every
cfg.sync_every (K) updates its threads applied it exchanges with the server:

    push   delta = params - base       its updates since the parameters of
                                       its last pull (base), their count, the
                                       server version and interval of that pull
    apply  the server applies it       the same algorithm one level up:
                                       hogwild/async on arrival, interval
                                       within the node interval's y pushes,
                                       sync averaged over one push per node
    pull   fresh parameters            the node rebases onto them, keeping the
                                       updates its threads applied meanwhile

Tickets. The server hands out update tickets exactly as the one-machine gate
does (TICKETS, LIMIT, DONE of iasgd.protocol.gate): a pull leases up to K of them; an
epoch's LIMIT is ceil(N_train / b) updates in all; DONE counts the updates
applied at the server. Only a node that holds no ticket waits for more (one
that still holds some gets none and pushes them first), so the epoch ends
(DONE reaches LIMIT) with every node idle, and the driver evaluates outside
the training clock.

Overlap. Except with sync, a node leases two exchanges' worth (2K) at the
start: its threads go on with the second K while the first exchange is in
flight. The updates applied during an exchange are carried into the next
push; `carried` counts them.

Staleness between nodes: tau_node = pushes applied at the server between
the pull a push's delta is taken against (its base) and the push. With
interval and the wait policy the pull takes one of the node interval's y
slots and the interval opens the next only after all y pushes are applied,
so tau_node <= y - 1; the drop policy drops a push whose interval closed or
filled. Carried updates were computed on the previous base (one exchange
older); that is the price of overlapping communication with computing.

A lost server: iasgd.executors.exchange (what a node and the server say to
each other, and where a node stands when the server is lost).
"""

from __future__ import annotations

import dataclasses
import socket
import threading
import time

import numpy as np

from iasgd import results
from iasgd.algorithms import ALGORITHMS, POLICIES, staleness_bound
from iasgd.config import TrainConfig, steps_per_epoch
from iasgd.data import Dataset
from iasgd.executors import deltas
from iasgd.executors.exchange import Link, Push, Rejoin, Reply, ServerLostError, Standing
from iasgd.nn.blas import single_threaded_blas
from iasgd.nn.models import Model
from iasgd.nn.network import all_finite
from iasgd.protocol import gate as G
from iasgd.protocol import workers as W
from iasgd.results import HIST_BINS, RunResult, Status
from iasgd.schedules import MONITOR_SECONDS, Controllers

POLL_S = 0.001  # how often a node looks at its threads and its exchange in flight


def node_interval(cfg: TrainConfig) -> int:
    """y of the cluster gate: --node-interval, else one push per node."""
    return cfg.node_interval or cfg.nodes


def node_seed(seed: int, node: int) -> int:
    """The seed of node `node`'s threads' random streams."""
    return int(np.random.SeedSequence([seed, 3, node]).generate_state(1)[0] >> 1)


class ParameterServer:
    """The global parameters and the cluster gate. Thread-safe: every call
    takes the server's lock; `exchange` may block (for tickets, for a slot
    of the next interval, for the rest of a sync round) and must run on a
    thread of its own per node (a Ray actor with that much concurrency)."""

    def __init__(self, params: np.ndarray, cfg: TrainConfig):
        self.cfg = cfg
        self.algo = ALGORITHMS[cfg.algo]
        self.interval = self.algo.bound == "interval"
        self.wait = self.interval and POLICIES[cfg.node_gate].code == G.WAIT
        self.params = np.array(params, np.float32)
        self.state = G.new_state(node_interval(cfg) if self.interval else G.UNBOUNDED)
        self.cond = threading.Condition()
        self.live = set(range(cfg.nodes))
        self.leased = dict.fromkeys(self.live, 0)  # tickets a node holds, not yet pushed
        self.slot = dict.fromkeys(self.live, -1)  # interval a node holds a slot of
        self.round_sum = np.zeros_like(self.params) if self.algo.loop == "sync" else None
        self.round_nodes: set[int] = set()
        self.round_counts: dict[int, int] = {}  # sync: updates of the round's pushes, per node
        self.rounds = 0
        self.node_done = [0] * cfg.nodes  # [n]: updates of node n's pushes in params
        self.node_hist = np.zeros(HIST_BINS, np.int64)  # tau_node of every applied push
        self.violations = 0
        self.pushes = self.dropped_pushes = self.dropped_updates = self.carried = 0
        self.lost: list[dict] = []
        # accumulated since the driver last took them (an epoch's figures)
        self.epoch = {"computed": 0, "loss_sum": 0.0, "hist": np.zeros(HIST_BINS, np.int64)}
        self.computed = 0
        self.busy_s = 0.0
        self.started = time.perf_counter()  # reset at the first exchange
        self._warm_up()

    def _warm_up(self) -> None:
        """Load the compiled functions the server calls, on scratch arrays,
        so that the first push does not pay for it (busy_s)."""
        scratch, empty = self.state.copy(), self.params[:0]
        G.allow(scratch, 1)
        G.take_ticket(scratch)
        G.try_slot(scratch)
        G.commit_step(scratch, G.generation(scratch), True)
        G.crossed(scratch, G.begin_apply(scratch))
        G.finish_apply(scratch)
        G.settle_many(scratch, 1)
        G.return_ticket(scratch)
        G.read_version(scratch)
        deltas.add_scaled(empty, empty, 1.0)
        all_finite(empty)

    # ----------------------------------------------------------- the driver

    def allow(self, limit: int) -> None:
        """Tickets up to `limit` updates in all (the end of the next epoch)."""
        with self.cond:
            G.allow(self.state, limit)
            self.cond.notify_all()

    def stop(self) -> None:
        with self.cond:
            G.request_stop(self.state)
            self.cond.notify_all()

    def progress(self) -> dict:
        """Where the run stands: updates applied (DONE) and allowed (LIMIT),
        whether it stopped or diverged, the nodes alive."""
        with self.cond:
            s = self.state
            return {"done": int(s[G.DONE]), "limit": int(s[G.LIMIT]),
                    "stopped": bool(s[G.STOP]), "diverged": bool(s[G.DIVERGED]),
                    "live": sorted(self.live), "y": int(s[G.Y]) if self.interval else None}

    def wait_progress(self, limit: int, timeout_s: float) -> dict:
        """progress() and counters(), once `limit` updates are applied or the
        run stopped, or after timeout_s: the driver learns at once that an
        allowance ended, and keeps the figures a new server would need."""
        with self.cond:
            self.cond.wait_for(lambda: self.state[G.DONE] >= limit or self.state[G.STOP],
                               timeout_s)
            return {**self.progress(), "counters": self.counters()}

    def counters(self) -> dict:
        """The run-wide figures, JSON-able: what server_summary reports and
        take_over continues from (histograms trimmed; busy_s and wall_s in
        seconds; state: the gate's state array as a list)."""
        with self.cond:
            return {"pushes": self.pushes, "dropped_pushes": self.dropped_pushes,
                    "dropped_updates": self.dropped_updates, "carried": self.carried,
                    "computed": self.computed, "violations": self.violations,
                    "rounds": self.rounds, "lost": list(self.lost), "busy_s": self.busy_s,
                    "wall_s": time.perf_counter() - self.started,
                    "state": self.state.tolist(), "node_hist": results.trimmed(self.node_hist),
                    "epoch": {"computed": self.epoch["computed"],
                              "loss_sum": self.epoch["loss_sum"],
                              "hist": results.trimmed(self.epoch["hist"])}}

    def take_epoch(self) -> dict:
        """This epoch's computed count, loss sum and staleness inside the
        nodes (from their pushes); resets them."""
        with self.cond:
            taken = self.epoch
            self.epoch = {"computed": 0, "loss_sum": 0.0,
                          "hist": np.zeros(HIST_BINS, np.int64)}
            return taken

    def get_params(self) -> np.ndarray:
        with self.cond:
            return self.params.copy()

    def node_lost(self, node: int, why: str | None) -> int:
        """Node `node` is gone (why: what happened; None: it left, done):
        give back its tickets and its slot, leave it out of sync rounds.
        Returns the nodes still alive."""
        with self.cond:
            if node in self.live:
                self.live.discard(node)
                self._release(node)
                if why is not None:
                    self.lost.append({"node": node, "why": why,
                                      "at_s": time.perf_counter() - self.started})
                if not self.live:
                    G.request_stop(self.state)
                self._maybe_finish_round()
                self.cond.notify_all()
            return len(self.live)

    def _release(self, node: int) -> None:
        """Return the tickets a lost node holds, and its slot (counted as
        applied with no update, so that the interval can complete)."""
        for _ in range(self.leased[node]):
            G.return_ticket(self.state)
        self.leased[node] = 0
        if self.slot[node] >= 0:
            self.slot[node] = -1
            if G.finish_apply(self.state):
                self.cond.notify_all()

    def snapshot(self) -> tuple[dict[str, np.ndarray], dict]:
        """Arrays and JSON-able figures to continue from (a checkpoint, or
        the driver's copy should the server be lost: `in_params` and
        `node_done` say which updates the parameters hold)."""
        with self.cond:
            arrays = {"params": self.params.copy(), "server_state": self.state.copy(),
                      "node_hist": self.node_hist.copy()}
            meta = {"pushes": self.pushes, "dropped_pushes": self.dropped_pushes,
                    "dropped_updates": self.dropped_updates, "carried": self.carried,
                    "computed": self.computed, "violations": self.violations,
                    "rounds": self.rounds, "lost": list(self.lost),
                    "in_params": self._in_params(), "node_done": list(self.node_done)}
            return arrays, meta

    def restore(self, arrays: dict[str, np.ndarray], meta: dict) -> None:
        """Continue from a snapshot: its parameters, counts and tickets
        (none leased, no slot held, the stop that ended it over)."""
        with self.cond:
            self.params[:] = arrays["params"]
            self.node_hist[:] = arrays["node_hist"]
            s = self.state
            old = arrays["server_state"]
            for slot in (G.VERSION, G.INTERVALS, G.Y_MAX, G.Y, G.Y_NEXT, G.DONE):
                s[slot] = old[slot]
            s[G.TICKETS] = s[G.LIMIT] = old[G.DONE]
            for key in ("pushes", "dropped_pushes", "dropped_updates", "carried", "computed",
                        "violations", "rounds"):
                setattr(self, key, meta[key])
            self.lost = list(meta["lost"])
            self.node_done = list(meta.get("node_done", self.node_done))

    def take_over(self, base: Standing, held: dict[int, int], limit: int, counters: dict
                  ) -> None:
        """Continue the run of a server that was lost. self.params (given at
        construction) are `base`'s: they hold base.done updates, at version
        base.version. `held`: the live nodes and the tickets each holds, not
        yet pushed; tickets are allowed up to `limit`; `counters`: the lost
        server's last counters(). The tickets it handed out that are neither
        in the parameters nor held (a push lost with it) are handed out
        again. No slot is held: the next interval opens empty."""
        with self.cond:
            s, old = self.state, counters["state"]
            for slot in (G.INTERVALS, G.Y_MAX, G.Y, G.Y_NEXT):
                s[slot] = old[slot]
            s[G.VERSION], s[G.DONE] = base.version, base.done
            s[G.TICKETS] = base.done + sum(held.values())
            s[G.LIMIT] = limit
            self.live = set(held)
            self.leased = {n: held.get(n, 0) for n in range(self.cfg.nodes)}
            self.node_done = list(base.contained)
            for key in ("pushes", "dropped_pushes", "dropped_updates", "carried", "computed",
                        "violations", "rounds", "busy_s"):
                setattr(self, key, counters[key])
            self.lost = list(counters["lost"])
            self.node_hist[:len(counters["node_hist"])] = counters["node_hist"]
            epoch = counters["epoch"]
            self.epoch["computed"], self.epoch["loss_sum"] = epoch["computed"], epoch["loss_sum"]
            self.epoch["hist"][:len(epoch["hist"])] = epoch["hist"]
            self.started = time.perf_counter() - counters["wall_s"]

    def summary(self) -> dict:
        """Run-wide figures of the cluster level."""
        return server_summary(self.counters(), self.cfg)

    # ------------------------------------------------------------ the nodes

    def exchange(self, push: Push, want: int) -> Reply:
        """Apply `push`, then lease up to `want` tickets and pull. Blocks
        while no ticket is left (until the driver allows more), for a slot
        of the next interval (wait policy) and, with sync, until every live
        node has pushed this round."""
        with self.cond:
            if not self.pushes and push.delta is None and not self.computed:
                self.started = time.perf_counter()  # the nodes are up: the clock of busy_s
            if push.node not in self.live or self.state[G.STOP]:
                return self._reply(-1, 0, stop=True)  # a lost node's work is not wanted
            applied, waited = True, 0.0
            if push.delta is not None:
                t0, round_of_push = time.perf_counter(), self.rounds
                applied = self._apply(push)
                self.busy_s += time.perf_counter() - t0
                if self.algo.loop == "sync":
                    t0 = time.perf_counter()
                    self._wait_round(round_of_push)
                    waited = time.perf_counter() - t0
            t_wait = time.perf_counter()
            granted = self._lease(push.node, want)
            # a node that will push again needs a slot of the interval to push in
            gen = self._take_slot(push.node) if self.leased[push.node] else -1
            if push.node not in self.live:  # lost while it waited
                self._release(push.node)
                return self._reply(-1, 0, stop=True)
            t0 = time.perf_counter()
            reply = self._reply(gen, granted, stop=bool(self.state[G.STOP]), applied=applied)
            reply.waited_s = t0 - t_wait + waited
            self.busy_s += time.perf_counter() - t0
            return reply

    def _reply(self, gen: int, granted: int, stop: bool, applied: bool = True) -> Reply:
        return Reply(self.params.copy(), int(G.read_version(self.state)), gen, granted, stop,
                     applied, done=self._in_params(), contained=list(self.node_done))

    def _in_params(self) -> int:
        """Updates the parameters hold: DONE less a sync round's pushes not
        applied yet (DONE counts them at the push)."""
        return int(self.state[G.DONE]) - sum(self.round_counts.values())

    def _account(self, push: Push) -> None:
        self.computed += push.computed
        self.epoch["computed"] += push.computed
        self.epoch["loss_sum"] += push.loss_sum
        self.epoch["hist"][:len(push.hist)] += np.asarray(push.hist, np.int64)
        self.leased[push.node] -= push.count

    def _apply(self, push: Push) -> bool:
        """Apply one push with the cluster algorithm; False if dropped."""
        s = self.state
        self._account(push)
        if push.diverged or not all_finite(push.delta):
            G.mark_diverged(s)
            self.cond.notify_all()
            return False
        gen, self.slot[push.node] = self.slot[push.node], -1
        if self.interval and not self.wait:
            gen = push.gen
        if not G.commit_step(s, gen, self.interval and not self.wait):
            self.dropped_pushes += 1
            self.dropped_updates += push.count
            for _ in range(push.count):
                G.return_ticket(s)
            self.cond.notify_all()  # a node may be waiting for those tickets
            return False
        self.pushes += 1
        self.carried += push.carried
        if self.algo.loop == "sync":
            deltas.add_scaled(self.round_sum, push.delta, 1.0)
            self.round_nodes.add(push.node)
            self.round_counts[push.node] = self.round_counts.get(push.node, 0) + push.count
            self.node_hist[0] += 1
            self._settle(push.count)
            self._maybe_finish_round()
            return True
        tau = G.begin_apply(s) - push.v_base
        deltas.add_scaled(self.params, push.delta, 1.0)
        self.node_done[push.node] += push.count
        if self.interval:
            if G.crossed(s, gen) or tau > int(s[G.Y]) - 1:
                self.violations += 1
            if G.finish_apply(s):
                self.cond.notify_all()  # an interval opened
        self.node_hist[min(tau, HIST_BINS - 1)] += 1
        self._settle(push.count)
        return True

    def _settle(self, count: int) -> None:
        """`count` updates are applied; the driver waits for the allowance's end."""
        G.settle_many(self.state, count)
        if self.state[G.DONE] >= self.state[G.LIMIT]:
            self.cond.notify_all()

    def _maybe_finish_round(self) -> None:
        """sync: once every live node has pushed, apply the mean of the
        round's pushes as one update."""
        if self.round_sum is None or not self.round_nodes or not self.live <= self.round_nodes:
            return
        deltas.add_scaled(self.params, self.round_sum, 1.0 / len(self.round_nodes))
        self.round_sum[:] = 0
        self.round_nodes = set()
        for node, count in self.round_counts.items():
            self.node_done[node] += count
        self.round_counts = {}
        G.begin_apply(self.state)
        self.rounds += 1
        self.cond.notify_all()

    def _wait_round(self, rounds: int) -> None:
        """sync: wait until round `rounds` is applied (or the run stops)."""
        while self.rounds == rounds and not self.state[G.STOP]:
            self.cond.wait()

    def _lease(self, node: int, want: int) -> int:
        """Take up to `want` tickets for `node`. Only a node that holds none
        waits while none is left: one that still holds some must push them
        first, or the epoch (which waits for them) would never end."""
        granted = 0
        while want > 0 and not self.state[G.STOP] and node in self.live:
            # near the end of an allowance the rest is shared among the live
            # nodes, so that they finish together rather than one idling
            left = int(self.state[G.LIMIT] - self.state[G.TICKETS])
            share = min(want, max(1, -(-left // max(len(self.live), 1))))
            while granted < share and G.take_ticket(self.state):
                granted += 1
            if granted or self.leased[node]:
                break
            self.cond.wait()
        self.leased[node] += granted
        return granted

    def _take_slot(self, node: int) -> int:
        """The interval the node's next push belongs to: with the wait
        policy a slot of it, waiting for the next interval while all y are
        taken; otherwise the open one."""
        if not self.wait:
            return int(G.generation(self.state))
        while not self.state[G.STOP] and node in self.live:
            gen = int(G.try_slot(self.state))
            if gen >= 0:
                self.slot[node] = gen
                return gen
            self.cond.wait()
        return -1


def server_summary(counters: dict, cfg: TrainConfig) -> dict:
    """Run-wide figures of the cluster level, from a server's counters()
    (the driver makes them from its last copy when the server is lost)."""
    hist = np.asarray(counters["node_hist"], np.int64)
    applied = int(hist.sum())
    wall = max(counters["wall_s"], 1e-9)
    state = np.asarray(counters["state"], np.int64)
    return {
        "pushes": counters["pushes"], "dropped_pushes": counters["dropped_pushes"],
        "dropped_updates": counters["dropped_updates"], "carried": counters["carried"],
        "computed": counters["computed"], "applied": int(state[G.DONE]),
        "pushes_per_s": counters["pushes"] / wall, "busy_fraction": counters["busy_s"] / wall,
        "intervals": int(state[G.INTERVALS]), "sync_rounds": counters["rounds"],
        "lost_nodes": list(counters["lost"]),
        "node_staleness": {
            "hist": hist.tolist(),
            "mean": float(np.dot(np.arange(hist.size), hist) / applied) if applied else 0.0,
            "max": hist.size - 1 if applied else 0,
            "bound": staleness_bound(cfg.algo, state),
            "violations": counters["violations"],
        },
    }


# ----------------------------------------------------------------- a node

class Node:
    """One node: a team of threads training a copy of the parameters, and
    the loop that exchanges its updates with the server (module doc)."""

    def __init__(self, node: int, model: Model, data: Dataset, cfg: TrainConfig,
                 segment: int = 0):
        from iasgd.executors.threads import Team, usable_cores  # the threads executor, on this node

        # segment: how often the run was resumed (it seeds the threads' streams, so
        # that a resumed run draws new batches, as on one machine)
        self.node, self.cfg, self.segment = node, cfg, segment
        self.local_cfg = dataclasses.replace(cfg, seed=node_seed(cfg.seed, node))
        quota = steps_per_epoch(data.x_train.shape[0], cfg.batch_size)
        self.result = RunResult(status=Status.COMPLETED)
        self.control = Controllers(self.local_cfg, quota, self.result, cores=usable_cores())
        self.team = Team(model, data, self.local_cfg, model.init(cfg.seed), self.control)
        self.base = np.zeros_like(self.team.params)
        self.delta = np.zeros_like(self.team.params)
        self.param_bytes = self.team.params.nbytes
        self.stats = {"node": node, "host": socket.gethostname(), "threads": cfg.threads,
                      "pushes": 0, "dropped_pushes": 0, "carried": 0, "stalled_s": 0.0,
                      "exchange_s": 0.0, "server_wait_s": 0.0, "bytes": 0, "rtt_ms": [],
                      "rejoins": 0, "rejoin_s": 0.0}
        self.v_base, self.gen, self.carried = -1, -1, 0  # of the last pull; carried into a push
        self.done_base, self.contained = 0, []  # what the last pull's parameters hold
        self.limit = self.pushed = 0  # tickets leased, updates pushed (since the start)
        self.rejoin: Rejoin | None = None
        self._t_start: float | None = None
        self._ticked = 0.0

    def warm_up(self) -> None:
        """Load (or compile) the threads' loop and the exchange's kernels
        before any clock starts."""
        self.team.warm_up()
        empty = self.base[:0]
        deltas.difference(empty, empty, empty)
        deltas.rebase(empty, empty, empty, empty)
        all_finite(empty)

    def stop(self) -> None:
        """Stop the threads now (the loop then ends at its next look)."""
        G.request_stop(self.team.state)

    def run(self, link: Link, rejoin: Rejoin | None = None) -> dict:
        """Train until the server says stop; returns this node's figures.
        rejoin: how to wait for a new server if the link finds it lost
        (None: ServerLostError ends the run)."""
        with single_threaded_blas():  # the kernels' GEMMs: one core per worker thread
            return self._run(link, rejoin)

    def _run(self, link: Link, rejoin: Rejoin | None) -> dict:
        team, cfg = self.team, self.cfg
        self.rejoin = rejoin
        depth = 1 if ALGORITHMS[cfg.algo].loop == "sync" else 2
        self.warm_up()
        reply = self._exchange(link, Push(self.node, None, 0, 0, -1), depth * cfg.sync_every)
        np.copyto(team.params, reply.params)
        self._t_start = time.perf_counter()
        team.start(self.segment)
        computed = 0
        try:
            while not reply.stop:
                self._take(reply)
                self.limit += reply.granted
                G.allow(team.state, self.limit)
                done = self._accumulate(self.pushed, self.limit)
                diverged = bool(team.state[G.DIVERGED])
                if G.stopped(team.state) and not diverged:
                    break  # stopped from outside: the run is over
                deltas.difference(team.params, self.base, self.delta)
                hist, loss_sum = team.end_epoch_stats()
                now_computed = team.total(W.COMPUTED)
                push = Push(self.node, self.delta, done - self.pushed, self.v_base, self.gen,
                            now_computed - computed, loss_sum, results.trimmed(hist),
                            self.carried, diverged)  # diverged: the server stops the run
                computed, self.pushed = now_computed, done
                reply = self._exchange(link, push, cfg.sync_every)
                deltas.rebase(team.params, self.base, self.delta, reply.params)
                self.stats["pushes"] += 1
                self.stats["dropped_pushes"] += not reply.applied
        finally:
            team.join()
        return self._figures(time.perf_counter() - self._t_start)

    def _take(self, reply: Reply) -> None:
        np.copyto(self.base, reply.params)
        self.v_base, self.gen = reply.version, reply.gen
        self.done_base, self.contained = reply.done, reply.contained

    def _accumulate(self, pushed: int, limit: int) -> int:
        """Let the threads apply updates until K more than `pushed` or the
        lease (`limit`) is used up, or they stopped; returns DONE."""
        team, every = self.team, self.cfg.sync_every
        while True:
            G.wait_settled(team.state, int(POLL_S * 1e6))
            done = int(team.state[G.DONE])
            if done - pushed >= every or done >= limit or G.stopped(team.state):
                return done
            self._steer()

    def _exchange(self, link: Link, push: Push, want: int) -> Reply:
        """Send `push`; while the reply is on its way the threads go on
        (their updates are carried into the next push), and the time they
        sit idle, having used up their lease, is counted as stalled."""
        team = self.team
        sent = time.perf_counter()
        done_at_send = int(team.state[G.DONE])
        poll = link(push, want)
        looked, stalled = sent, 0.0
        while True:
            try:
                reply = poll(POLL_S)
            except ServerLostError:
                if self.rejoin is None:
                    raise
                t0 = time.perf_counter()
                if not self.rejoin(self._standing(push)):  # the run is over
                    return Reply(self.base.copy(), self.v_base, -1, 0, stop=True)
                # Pull from the new server. The push lost with the old one
                # counts as applied: the new parameters hold it, or it is
                # lost; sending it again could apply it twice.
                self.stats["rejoins"] += 1
                self.stats["bytes"] += self.param_bytes
                sent = looked = time.perf_counter()
                self.stats["rejoin_s"] += sent - t0
                push = Push(self.node, None, 0, max(self.v_base, 0), -1)
                poll = link(push, want)
                continue
            if reply is not None:
                break
            now = time.perf_counter()
            if G.settled(team.state):  # the lease is used up: the threads wait for us
                stalled += now - looked
            looked = now
            self._steer()
        # the server's own waits (for the next allowance, a slot, a sync round)
        # are not the exchange's cost: they are counted as server_wait_s
        self.stats["stalled_s"] += max(stalled - reply.waited_s, 0.0)
        rtt = time.perf_counter() - sent
        self.stats["exchange_s"] += rtt
        self.stats["server_wait_s"] += reply.waited_s
        self.stats["rtt_ms"].append(1e3 * (rtt - reply.waited_s))  # the transfer and the apply
        self.stats["bytes"] += self.param_bytes * (1 if push.delta is None else 2)
        self.carried = int(team.state[G.DONE]) - done_at_send
        self.stats["carried"] += self.carried
        return reply

    def _standing(self, push: Push) -> Standing:
        """Where this node stands, `push` lost with the server."""
        return Standing(self.node, self.v_base, self.done_base, list(self.contained),
                        held=self.limit - self.pushed, in_flight=push.count)

    def _steer(self) -> None:
        """Every MONITOR_SECONDS: the node's schedules steer its threads, as
        on one machine; non-finite parameters stop them."""
        now = time.perf_counter()
        if self._t_start is None or now - self._ticked < MONITOR_SECONDS:
            return
        self._ticked = now
        self.team.check_diverged()
        self.team.steer(now - self._t_start)

    def _figures(self, seconds: float) -> dict:
        team, st = self.team, self.stats
        hist = team.run_hist + team.hist.sum(axis=0)
        applied = team.total(W.APPLIED)
        rtt = np.array(st.pop("rtt_ms") or [0.0])
        return {**st, "computed": team.total(W.COMPUTED), "applied": applied,
                "dropped": team.total(W.DROPPED),
                "samples_per_s": applied * self.cfg.batch_size / max(seconds, 1e-9),
                "seconds": seconds, "diverged": bool(team.state[G.DIVERGED]),
                "rtt_ms_p50": float(np.percentile(rtt, 50)),
                "rtt_ms_p99": float(np.percentile(rtt, 99)),
                "staleness": {
                    "hist": results.trimmed(hist), "max": int(team.counters[:, W.TAU_MAX].max()),
                    "mean": float(team.total(W.TAU_SUM) / max(applied, 1)),
                    "bound": staleness_bound(self.cfg.algo, team.state),
                    "violations": team.total(W.VIOLATIONS)},
                "interval_trace": self.result.interval_trace,
                "threads_trace": self.result.threads_trace}
