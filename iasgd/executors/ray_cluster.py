"""The Ray executor: the nodes and the parameter server of iasgd.executors.cluster as
Ray actors, and the driver that runs epochs over them as the threads
executor does on one machine (allowances, evaluation outside the training
clock, time budget, stop requests, divergence, checkpoints), plus what a
cluster adds: a node that dies is left out and the others go on, and a
parameter server that dies is started again, on the driver's machine, from
the freshest parameters a node or the driver holds (docs/cluster.md#faults).

Ray is an optional extra (pip install -e '.[ray]'); it is imported only here
and in iasgd.executors.ray_connect, which reaches it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import threading
import time

import numpy as np

from iasgd.algorithms import ALGORITHMS
from iasgd.config import TrainConfig, steps_per_epoch
from iasgd.data import Dataset
from iasgd.executors.base import (
    EpochEnd,
    ExecutorBase,
    first_params,
    mean_loss,
    one_thread_blas_for_good,
)
from iasgd.executors.cluster import Node, ParameterServer, server_summary
from iasgd.executors.epochs import TrainingClock, train_in_chunks
from iasgd.executors.exchange import Push, ServerLostError, Standing, freshest, lost_updates
from iasgd.executors.ray_connect import (
    LOCAL_RAY_CONFIG,
    ClusterError,
    UnreachableClusterError,
    check_reachable,
    connect,
)
from iasgd.nn.models import Model
from iasgd.protocol import gate as G
from iasgd.results import HIST_BINS, Hooks, Live, RunResult, Snapshot, Status, result_meta, trimmed

# reaching Ray (iasgd.executors.ray_connect), as the command line and the tests name it here
__all__ = ["LOCAL_RAY_CONFIG", "ClusterError", "NodeActor", "RayRun", "UnreachableClusterError",
           "check_reachable"]

POLL_S = 0.05  # how often the driver looks at the run
NODE_RESULTS_S = 60.0  # how long the driver waits for the nodes' figures after a stop
STANDING_S = 60.0  # how long the driver waits for a node to stop at a lost server


class ServerGoneError(Exception):
    """The parameter server was lost and could not be started again (the
    driver saves its last copy of it)."""


class NodeActor:
    """A node (iasgd.executors.cluster.Node) in its own Ray worker process.
    When its server is lost it waits, its standing published, until the
    driver gives it a new one (`reconnect`) or stops it."""

    def __init__(self, node: int, model: Model, data: Dataset, cfg: TrainConfig, server,
                 segment: int = 0):
        # the object store hands out read-only arrays: compiled code would be
        # specialised (and compiled) again for them, so take a private copy
        data = dataclasses.replace(data, x_train=np.array(data.x_train),
                                   y_train=np.array(data.y_train))
        one_thread_blas_for_good()  # this process trains this node alone, from its warm-up
        self.inner = Node(node, model, data, cfg, segment)
        self.server = server
        self.cond = threading.Condition()
        self.waiting: Standing | None = None  # set while it waits for a new server
        self.over = False  # its run ended, or the driver stopped it

    def run(self) -> dict:
        import ray

        def link(push: Push, want: int):
            server = self.server
            ref = server.exchange.remote(push, want)

            def poll(timeout_s: float):
                ready, _ = ray.wait([ref], timeout=timeout_s)
                if not ready:
                    return None
                try:
                    return ray.get(ref)
                except ray.exceptions.RayActorError as e:  # the server died, or seems to
                    # have it killed: then the driver, whose next call fails,
                    # starts the new server this node waits for
                    with contextlib.suppress(Exception):
                        ray.kill(server)
                    raise ServerLostError(type(e).__name__) from None
            return poll

        try:
            figures = self.inner.run(link, self._rejoin)
        finally:
            with self.cond:
                self.over = True
                self.cond.notify_all()
        figures["ray_node"] = ray.get_runtime_context().get_node_id()
        return figures

    def _rejoin(self, standing: Standing) -> bool:
        with self.cond:
            lost = self.server
            self.waiting = standing
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.server is not lost or self.over)
            self.waiting = None
            return not self.over

    def standing(self, timeout_s: float) -> Standing | None:
        """Once this node waits for a new server: where it stands (None if
        its run ended first, or after timeout_s)."""
        with self.cond:
            self.cond.wait_for(lambda: self.waiting is not None or self.over, timeout_s)
            return self.waiting

    def base(self) -> np.ndarray:
        """The parameters of its last pull (Standing.version)."""
        return self.inner.base.copy()

    def reconnect(self, server) -> None:
        """Exchange with `server` from now on (the last one was lost)."""
        with self.cond:
            self.server = server
            self.cond.notify_all()

    def warm_up(self) -> None:
        self.inner.warm_up()

    def stop(self) -> None:
        self.inner.stop()
        with self.cond:  # a node waiting for a new server stops waiting
            self.over = True
            self.cond.notify_all()

    def pid(self) -> int:
        return os.getpid()


class RayRun(ExecutorBase):
    """A parallel algorithm on cfg.nodes Ray node actors of cfg.threads
    threads each, and a parameter server actor (iasgd.executors.cluster) on
    the driver's machine. A snapshot holds the server's parameters and
    counts; a resumed run starts its nodes afresh from them (their momentum
    starts again from zero). A lost server is started again
    (_restart_server); if it cannot be, the run saves the driver's last copy
    of the server (taken at every epoch end and evaluation) and raises
    ClusterError."""

    def __init__(self, model: Model, data: Dataset, cfg: TrainConfig,
                 resume: Snapshot | None = None, address: str | None = None,
                 init: np.ndarray | None = None):
        self.ray = connect(address, cfg)
        self.model, self.data, self.cfg = model, data, cfg
        self.quota = steps_per_epoch(data.x_train.shape[0], cfg.batch_size)
        self.result = RunResult(status=Status.COMPLETED)
        self.run_hist = np.zeros(HIST_BINS, np.int64)
        self.epoch, self.epoch_time = 1, 0.0
        self.segment = 0  # how often the run was resumed: it seeds the nodes' streams
        ray = self.ray
        self.started = time.perf_counter()
        self.here = ray.get_runtime_context().get_node_id()  # the driver's Ray node
        self.handles: list = []
        self.running: dict = {}  # run() of each node still running -> the node
        self.restarts: list[dict] = []  # one per server started again
        self.gone: str | None = None  # why the server was lost for good
        # the nodes start from the server's parameters at their first pull
        self.server = self._new_server(first_params(model, cfg, init))
        try:
            if resume is not None:
                self._restore(resume)
            # what a new server would start from, should this one be lost
            self._keep_copy(*ray.get(self.server.snapshot.remote()), self.epoch, self.epoch_time)
            self.known = ray.get(self.server.counters.remote())
        except ray.exceptions.RayActorError as e:
            ray.kill(self.server)
            raise ClusterError(f"cannot start the parameter server ({one_line(e)})") from None
        self.limit = int(self.known["state"][G.LIMIT])  # tickets allowed so far
        data_ref = ray.put(data)
        node_actor = ray.remote(NodeActor).options(num_cpus=cfg.threads, max_concurrency=4,
                                                   scheduling_strategy="SPREAD")
        self.handles = [node_actor.remote(i, model, data_ref, cfg, self.server, self.segment)
                        for i in range(cfg.nodes)]
        # every node up and its compiled code loaded before the clock starts
        ray.get([h.warm_up.remote() for h in self.handles])
        self.running = {h.run.remote(): i for i, h in enumerate(self.handles)}
        self.figures: dict[int, dict] = {}

    def _new_server(self, params: np.ndarray):
        """A parameter server actor on the driver's machine: wherever Ray
        would put it, it could die with a machine the run can lose."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(self.here, soft=False)
        return self.ray.remote(ParameterServer).options(
            max_concurrency=self.cfg.nodes + 8, num_cpus=0, scheduling_strategy=here,
        ).remote(params, self.cfg)

    def _restore(self, snap: Snapshot) -> None:
        meta, arrays = snap.meta, snap.arrays
        self.ray.get(self.server.restore.remote(
            {k: arrays[k] for k in ("params", "server_state", "node_hist")}, meta["server"]))
        self.epoch, self.epoch_time = meta["epoch"], meta["epoch_time"]
        self.segment = meta.get("segment", 0) + 1  # (a checkpoint saved before it had one: 0)
        self.run_hist[:] = arrays["run_hist"]
        self.restore_totals(meta["result"], arrays["params"], self.run_hist)

    def _keep_copy(self, arrays: dict[str, np.ndarray], meta: dict, epoch: int,
                   epoch_time: float) -> np.ndarray:
        """Keep a server snapshot as the driver's copy: a resume of it starts
        epoch `epoch`, `epoch_time` seconds into it. Returns its parameters."""
        self.copy = {"arrays": arrays, "meta": meta, "epoch": epoch, "epoch_time": epoch_time}
        return arrays["params"]

    def _copy_server(self, epoch: int, epoch_time: float) -> np.ndarray:
        """The server's parameters (to evaluate), kept as the driver's copy."""
        return self._keep_copy(*self._call("snapshot"), epoch, epoch_time)

    def snapshot(self) -> Snapshot:
        if self.gone is None:
            arrays, server_meta = self._call("snapshot")
            epoch, epoch_time = self.epoch, self.epoch_time
        else:  # the server is lost: the driver's copy
            arrays, server_meta = dict(self.copy["arrays"]), self.copy["meta"]
            epoch, epoch_time = self.copy["epoch"], self.copy["epoch_time"]
        arrays["run_hist"] = self.run_hist.copy()
        self.result.params = arrays["params"]
        meta = {"epoch": epoch, "epoch_time": epoch_time, "backend": "ray",
                "segment": self.segment, "server": server_meta,
                "result": result_meta(self.result)}
        return Snapshot(arrays, meta)

    # ------------------------------------------------------------------ run

    def run(self, hooks: Hooks, checkpoint_every: int = 0) -> RunResult:
        with contextlib.suppress(ServerGoneError):  # self.gone says why; saved below
            super().run(hooks, checkpoint_every)  # the nodes are shut down (end_run)
        r = self.result
        if self.gone is not None:
            r.status = "server_lost"
            hooks.on_checkpoint(self.snapshot())
            copy = self.copy
            raise ClusterError(
                f"the parameter server was lost ({self.gone}), so the run stopped; its "
                f"checkpoint is saved from the driver's copy of the server (epoch "
                f"{copy['epoch']}, {copy['meta']['in_params']} updates; --resume it)", r)
        if r.status == "nodes_lost":  # its checkpoint is written
            raise ClusterError("every node was lost, so the run stopped; its checkpoint is "
                               "saved (--resume it on a working cluster)", r)
        return r

    def end_run(self) -> None:
        self._shutdown()

    def train_epoch(self, hooks: Hooks) -> int:
        r, start = self.result, (self.epoch - 1) * self.quota
        self.clock = TrainingClock(self.epoch_time)
        self._hooks, self._reason, self._done = hooks, None, start
        train_in_chunks(self.applied_so_far, self.epoch * self.quota, self.cfg.eval_every,
                        run_until=self._run_until, stopped=lambda: self._reason is not None,
                        out_of_time=lambda: self._reason == Status.TIME_BUDGET,
                        evaluate=self.evaluate_inside_epoch)
        self.epoch_time = self.clock.elapsed()
        if self._reason is not None:
            self._call("stop")
            r.status = self._reason
        if r.status == Status.DIVERGED:
            r.diverged_at = {"epoch": self.epoch, "step": self._done - start + 1}
        return self._done - start

    def _run_until(self, limit: int) -> None:
        """Allow updates up to `limit` and watch the run until they are
        applied at the server or it must stop: self._done, the updates
        applied, and self._reason, why it stops (a Status, "nodes_lost", or
        None)."""
        self.limit = limit  # a new server allows as much
        self._call("allow", limit)
        self._last = (self._done, time.perf_counter())
        while True:
            progress = self._call("wait_progress", limit, POLL_S)
            self.known, self._y = progress["counters"], progress["y"]
            self._done = progress["done"]
            if progress["diverged"]:
                self._reason = Status.DIVERGED
            elif self._done < limit:
                self._reason = self.tick(self._hooks) if self._watch_nodes() else "nodes_lost"
            if self._reason or self._done >= limit:
                return

    def progress(self, seconds: float) -> tuple[int, Live]:
        # (after a server restart `done` may have gone back by the updates lost)
        (last_done, last_t), now = self._last, time.perf_counter()
        rate = max(self._done - last_done, 0) / max(now - last_t, 1e-9)
        self._last = (self._done, now)
        return ((self._done - (self.epoch - 1) * self.quota) * self.cfg.batch_size,
                Live(updates_per_s=rate, y=self._y))

    def check_diverged(self) -> bool:
        """The server stops a run whose node met a non-finite loss or
        parameter (its own parameters stay finite)."""
        return self._reason == Status.DIVERGED

    def params_now(self) -> np.ndarray:
        """The server's parameters, kept as the driver's copy."""
        return self._copy_server(self.epoch, self.clock.elapsed())

    def applied_so_far(self) -> int:
        return self._done

    def _watch_nodes(self) -> bool:
        """Take note of nodes that ended; a node that died is left out (a
        line says so). False when no node is left."""
        ray = self.ray
        ready, _ = ray.wait(list(self.running), num_returns=len(self.running), timeout=0)
        for ref in ready:
            node = self.running.pop(ref)
            try:
                self.figures[node] = ray.get(ref)
                # ended before the run (it diverged and told the server): what
                # it still held must not keep the others waiting
                self._call("node_lost", node, None)
            except ray.exceptions.RayError as e:  # the actor died (RayActorError) or failed
                self._lost_node(node, e)
        return bool(self.running)

    def _lost_node(self, node: int, error: Exception) -> None:
        why = f"{type(error).__name__}: {one_line(error)}"
        left = self._call("node_lost", node, why)
        going_on = "1 node goes on" if left == 1 else f"{left} nodes go on"
        print(f"iasgd: node {node} lost ({type(error).__name__}); {going_on}", file=sys.stderr,
              flush=True)

    # ------------------------------------------------------- a lost server

    def _call(self, method: str, *args):
        """ray.get of the server's `method`(*args). A lost server is started
        again (once per call); ServerGoneError if it cannot be, or the new one is
        lost as well."""
        for attempt in range(2):
            if self.gone is not None:
                raise ServerGoneError(self.gone)
            try:
                return self.ray.get(getattr(self.server, method).remote(*args))
            except self.ray.exceptions.RayActorError as e:
                if attempt:
                    self._give_up(f"{type(e).__name__}, again after a restart")
                self._restart_server(e)
        raise AssertionError("unreachable")

    def _give_up(self, why: str) -> None:
        self.gone = why
        with contextlib.suppress(Exception):
            self.ray.kill(self.server)
        self.server = None
        raise ServerGoneError(why)

    def _restart_server(self, error: Exception) -> None:
        """The server is lost (`error`): start another on the driver's
        machine from the freshest parameters a node (the last it pulled) or
        the driver's copy holds, with the driver's last counters, and
        reconnect the nodes to it (docs/cluster.md#faults). ServerGoneError if no
        node is left or the new server cannot be started."""
        ray = self.ray
        why = type(error).__name__
        with contextlib.suppress(Exception):  # it may only seem lost: it must take no push
            ray.kill(self.server)
        standings, ended, silent = self._ask_nodes()
        if not standings:
            self._give_up(f"{why}; no node was left to start another from")
        copy = Standing(-1, int(self.copy["arrays"]["server_state"][G.VERSION]),
                        self.copy["meta"]["in_params"], self.copy["meta"]["node_done"])
        base = freshest([copy, *standings.values()])
        # live at the new server: every node still running (those that ended
        # or died are then left out as usual), holding what they say they hold
        held = {**dict.fromkeys(ended + silent, 0),
                **{node: s.held for node, s in standings.items()}}
        server = None
        try:
            params = (self.copy["arrays"]["params"] if base is copy
                      else ray.get(self.handles[base.node].base.remote()))
            server = self._new_server(params)
            ray.get(server.take_over.remote(base, held, self.limit, self.known))
        except Exception as e:  # whatever it was, the run cannot go on
            if server is not None:
                with contextlib.suppress(Exception):
                    ray.kill(server)
            self._give_up(f"{why}; another could not be started: {type(e).__name__}: "
                          f"{one_line(e)}")
        self.server = server
        for node in standings:
            self.handles[node].reconnect.remote(server)
        lost = lost_updates(list(standings.values()), base)
        source = "the driver's copy" if base.node < 0 else f"node {base.node}"
        self.restarts.append({"why": f"{why}: {one_line(error)}",
                              "at_s": time.perf_counter() - self.started, "from": source,
                              "version": base.version, "updates": base.done,
                              "lost_updates": lost})
        print(f"iasgd: parameter server lost ({why}); started again on the driver's machine "
              f"from {source} ({base.done} updates), {lost} update{'s' if lost != 1 else ''} "
              "lost", file=sys.stderr, flush=True)
        for node in silent:
            self._lost_node(node, TimeoutError("no answer after the server was lost"))

    def _ask_nodes(self) -> tuple[dict[int, Standing], list[int], list[int]]:
        """Wait for every running node to stop at the lost server. Returns
        their standings, the nodes that ended or died meanwhile (_watch_nodes
        tells the new server), and those that did not answer in STANDING_S
        (stopped here; lost)."""
        ray = self.ray
        asked = {node: self.handles[node].standing.remote(STANDING_S)
                 for node in self.running.values()}
        runs = {node: ref for ref, node in self.running.items()}
        standings: dict[int, Standing] = {}
        ended: list[int] = []
        silent: list[int] = []
        for node, ref in asked.items():
            try:
                standing = ray.get(ref)
            except ray.exceptions.RayError:
                ended.append(node)
                continue
            if standing is not None:
                standings[node] = standing
            elif ray.wait([runs[node]], timeout=0)[0]:
                ended.append(node)
            else:
                silent.append(node)
                self.handles[node].stop.remote()
        return standings, ended, silent

    # ------------------------------------------------------------- results

    def close_epoch(self, applied: int) -> EpochEnd:
        r, b = self.result, self.cfg.batch_size
        # the server first: should it be lost for good here, the results
        # saved with the driver's copy must not count this epoch yet
        taken = self._call("take_epoch")
        # taken: a server started again must not count them again
        self.known["epoch"] = {"computed": 0, "loss_sum": 0.0, "hist": []}
        # a resume of the copy starts the next epoch (or, cut short, ends this one)
        after = (self.epoch + 1, 0.0) if r.status == Status.COMPLETED else (
            self.epoch, self.epoch_time)
        params = self._copy_server(*after)
        self.run_hist += taken["hist"]
        r.train_time_s += self.epoch_time
        r.samples += applied * b
        return EpochEnd(params, self.epoch_time, r.train_time_s,
                        mean_loss(taken["loss_sum"], applied), applied * b,
                        trimmed(taken["hist"]), (self.epoch - 1) * self.quota + applied)

    def finish(self) -> None:
        """Bring the run-wide figures up to date from the server (from the
        driver's copy if it is lost) and the nodes' figures once they have
        ended."""
        r = self.result
        try:
            server, r.params = self._call("summary"), self._call("get_params")
        except ServerGoneError:
            server, r.params = server_summary(self.known, self.cfg), self.copy["arrays"]["params"]
        r.applied = server["applied"]
        r.computed = server["computed"]
        r.dropped = server["dropped_updates"] + sum(f["dropped"] for f in self.figures.values())
        r.staleness_hist = self.run_hist
        nodes = [self.figures[i] for i in sorted(self.figures)]
        bounds = [f["staleness"]["bound"] for f in nodes]  # None: unbounded
        r.staleness_bound = (max(bounds) if bounds and None not in bounds
                             else 0 if ALGORITHMS[self.cfg.algo].bound == "zero" else None)
        nonzero = np.flatnonzero(self.run_hist)
        r.staleness_max = int(nonzero[-1]) if nonzero.size else 0
        r.bound_violations = (server["node_staleness"]["violations"]
                              + sum(f["staleness"]["violations"] for f in nodes))
        r.intervals = server["intervals"]
        moved = sum(f["bytes"] for f in nodes)
        r.cluster = {
            "backend": "ray", "ray_version": self.ray.__version__, "nodes": nodes,
            "server": server, "node_staleness": server.pop("node_staleness"),
            "bytes_per_sample": moved / max(r.samples, 1),
            "sync_every": self.cfg.sync_every,
            "server_node": self.here,  # the driver's Ray node: where the server runs
            "server_restarts": len(self.restarts),
            "lost_updates": sum(x["lost_updates"] for x in self.restarts),
            "restarts": list(self.restarts),
            "server_lost": self.gone,  # why the run stopped without a server, or None
        }

    def _shutdown(self) -> None:
        """Stop the server and the nodes, collect the nodes' figures, and
        free the actors."""
        ray = self.ray
        gone = ray.exceptions.RayError  # the server or a node died: go on without it
        if self.server is not None:
            with contextlib.suppress(gone):
                ray.get(self.server.stop.remote())
        for h in self.handles:
            h.stop.remote()
        if self.running:
            ready, _ = ray.wait(list(self.running), num_returns=len(self.running),
                                timeout=NODE_RESULTS_S)
            for ref in ready:
                node = self.running.pop(ref)
                with contextlib.suppress(gone):
                    self.figures[node] = ray.get(ref)
        with contextlib.suppress(gone):
            self.finish()
        for h in [*self.handles, self.server]:
            if h is not None:
                ray.kill(h)


def one_line(error: BaseException) -> str:
    """The first line of an error's message (Ray's run to many)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
