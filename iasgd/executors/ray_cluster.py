"""The Ray executor: the nodes and the parameter server of iasgd.executors.cluster as
Ray actors, and the driver that runs epochs over them as the threads
executor does on one machine (allowances, evaluation outside the training
clock, time budget, stop requests, divergence, checkpoints), plus what a
cluster adds: a node that dies is left out and the others go on.

Ray is an optional extra (pip install -e '.[ray]'); it is imported only here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import sys
import time

import numpy as np

from iasgd.algorithms import ALGORITHMS
from iasgd.config import TrainConfig, eval_points, steps_per_epoch
from iasgd.data import Dataset
from iasgd.executors.cluster import Node, ParameterServer, Push
from iasgd.executors.epochs import TrainingClock, run_epochs
from iasgd.nn.models import Model
from iasgd.results import (
    HIST_BINS,
    Hooks,
    Live,
    RunResult,
    Snapshot,
    Status,
    record_epoch,
    record_eval,
    restore_result,
    result_meta,
)

POLL_S = 0.05  # how often the driver looks at the run
CONNECT_S = 5.0  # how long --address may take to answer
NODE_RESULTS_S = 60.0  # how long the driver waits for the nodes' figures after a stop


class ClusterError(RuntimeError):
    """The cluster cannot go on (one line: what and what to do)."""

    exit_code = 1  # the command line's exit code: a failure


class UnreachableClusterError(ClusterError):
    """Ray is missing, or the cluster cannot be started or reached."""

    exit_code = 2  # bad input: nothing was computed


def import_ray():
    try:
        import ray
    except ImportError:
        raise UnreachableClusterError("--backend ray needs Ray: pip install -e '.[ray]'") from None
    return ray


def connect(address: str | None, cfg: TrainConfig):
    """Ray, connected: to the cluster at `address` ("auto": the one this
    machine belongs to), or to a new local one with room for every node's
    threads and no dashboard. Ray (>= 2.59) authenticates a local cluster
    with a token of its own; a cluster joined uses the token its nodes were
    started with (docs/cluster.md)."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    if address not in (None, "auto"):
        check_reachable(address)
    try:
        if address is None:
            ray.init(address="local",  # a new one, even where another is running
                     num_cpus=max(os.cpu_count() or 1, cfg.nodes * cfg.threads),
                     include_dashboard=False, configure_logging=False, log_to_driver=False)
        else:
            ray.init(address=address, configure_logging=False, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        where = "a local Ray" if address is None else f"the Ray cluster at {address}"
        raise UnreachableClusterError(f"cannot start or reach {where} ({first}); check that "
                           "`ray status` works there") from None
    return ray


def check_reachable(address: str) -> None:
    """UnreachableClusterError at once if nothing answers at HOST[:PORT]
    (Ray itself would retry for minutes)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        host, port = address.removeprefix("ray://"), "6379"
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_S).close()
    except OSError as e:
        raise UnreachableClusterError(
            f"cannot reach the Ray cluster at {address} ({e.strerror or e}); start it with "
            "`ray start --head` there, or check --address") from None


class NodeActor:
    """A node (iasgd.executors.cluster.Node) in its own Ray worker process."""

    def __init__(self, node: int, model: Model, data: Dataset, cfg: TrainConfig, server):
        # the object store hands out read-only arrays: compiled code would be
        # specialised (and compiled) again for them, so take a private copy
        data = dataclasses.replace(data, x_train=np.array(data.x_train),
                                   y_train=np.array(data.y_train))
        self.inner = Node(node, model, data, cfg)
        self.server = server

    def run(self) -> dict:
        import ray

        def link(push: Push, want: int):
            ref = self.server.exchange.remote(push, want)

            def poll(timeout_s: float):
                ready, _ = ray.wait([ref], timeout=timeout_s)
                return ray.get(ref) if ready else None
            return poll

        figures = self.inner.run(link)
        figures["ray_node"] = ray.get_runtime_context().get_node_id()
        return figures

    def warm_up(self) -> None:
        self.inner.warm_up()

    def stop(self) -> None:
        self.inner.stop()

    def pid(self) -> int:
        return os.getpid()


class RayRun:
    """A parallel algorithm on cfg.nodes Ray node actors of cfg.threads
    threads each, and a parameter server actor (iasgd.executors.cluster). A snapshot
    holds the server's parameters and counts; a resumed run starts its nodes
    afresh from them (their momentum starts again from zero)."""

    def __init__(self, model: Model, data: Dataset, cfg: TrainConfig,
                 resume: Snapshot | None = None, address: str | None = None):
        self.ray = connect(address, cfg)
        self.model, self.data, self.cfg = model, data, cfg
        self.quota = steps_per_epoch(data.x_train.shape[0], cfg.batch_size)
        self.result = RunResult(status=Status.COMPLETED)
        self.run_hist = np.zeros(HIST_BINS, np.int64)
        self.epoch, self.epoch_time = 1, 0.0
        params = model.init(cfg.seed)
        ray = self.ray
        self.server = ray.remote(ParameterServer).options(
            max_concurrency=cfg.nodes + 8, num_cpus=0).remote(params, cfg)
        if resume is not None:
            self._restore(resume)
        data_ref = ray.put(data)
        node_actor = ray.remote(NodeActor).options(num_cpus=cfg.threads, max_concurrency=2,
                                                   scheduling_strategy="SPREAD")
        self.handles = [node_actor.remote(i, model, data_ref, cfg, self.server)
                        for i in range(cfg.nodes)]
        # every node up and its compiled code loaded before the clock starts
        ray.get([h.warm_up.remote() for h in self.handles])
        self.running = {h.run.remote(): i for i, h in enumerate(self.handles)}
        self.figures: dict[int, dict] = {}

    def _restore(self, snap: Snapshot) -> None:
        meta, arrays = snap.meta, snap.arrays
        self.ray.get(self.server.restore.remote(
            {k: arrays[k] for k in ("params", "server_state", "node_hist")}, meta["server"]))
        self.epoch, self.epoch_time = meta["epoch"], meta["epoch_time"]
        self.run_hist[:] = arrays["run_hist"]
        restored = restore_result(meta["result"], arrays["params"], self.run_hist)
        vars(self.result).update(vars(restored))
        self.result.status = Status.COMPLETED

    def snapshot(self) -> Snapshot:
        arrays, server_meta = self.ray.get(self.server.snapshot.remote())
        arrays["run_hist"] = self.run_hist.copy()
        self.result.params = arrays["params"]
        meta = {"epoch": self.epoch, "epoch_time": self.epoch_time, "backend": "ray",
                "server": server_meta, "result": result_meta(self.result)}
        return Snapshot(arrays, meta)

    # ------------------------------------------------------------------ run

    def run(self, hooks: Hooks, checkpoint_every: int = 0) -> RunResult:
        try:
            result = run_epochs(self, hooks, checkpoint_every)
        finally:
            self._shutdown()
        if result.status == "nodes_lost":  # its checkpoint is written
            raise ClusterError("every node was lost, so the run stopped; its checkpoint is "
                               "saved (--resume it on a working cluster)")
        return result

    def epoch_samples(self) -> int:
        return self.quota * self.cfg.batch_size

    def train_epoch(self, hooks: Hooks) -> int:
        cfg, r, ray = self.cfg, self.result, self.ray
        start = (self.epoch - 1) * self.quota
        end = self.epoch * self.quota
        clock = TrainingClock(self.epoch_time)
        reason = None
        done = start
        for limit in eval_points(start, end, cfg.eval_every):
            ray.get(self.server.allow.remote(limit))
            done, reason = self._wait_for(limit, start, clock, hooks)
            if reason or done < limit:
                break
            if limit < end:  # an eval_every boundary, outside the training clock
                t = time.perf_counter()
                record_eval(r, self.model, self.data, self._params(),
                            seconds=r.train_time_s + clock.elapsed(), applied=done)
                clock.exclude(time.perf_counter() - t)
        self.epoch_time = clock.elapsed()
        if reason is not None:
            ray.get(self.server.stop.remote())
            r.status = reason
        if r.status == Status.DIVERGED:
            r.diverged_at = {"epoch": self.epoch, "step": done - start + 1}
        return done - start

    def _wait_for(self, limit: int, start: int, clock: TrainingClock, hooks: Hooks
                  ) -> tuple[int, str | None]:
        """Watch the run until `limit` updates are applied at the server or
        it must stop. Returns the updates applied and why it stops (a
        Status, "nodes_lost", or None)."""
        cfg, r, ray = self.cfg, self.result, self.ray
        last_done, last_t = start, time.perf_counter()
        while True:
            progress = ray.get(self.server.wait_progress.remote(limit, POLL_S))
            done = progress["done"]
            if progress["diverged"]:
                return done, Status.DIVERGED
            if done >= limit:
                return done, None
            if not self._watch_nodes():
                return done, "nodes_lost"
            why = hooks.should_stop()
            if why:
                return done, why
            now = time.perf_counter()
            if cfg.over_budget(r.train_time_s + clock.elapsed()):
                return done, Status.TIME_BUDGET
            hooks.on_progress((done - start) * cfg.batch_size,
                              Live(updates_per_s=(done - last_done) / max(now - last_t, 1e-9),
                                   y=progress["y"]))
            last_done, last_t = done, now

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
                ray.get(self.server.node_lost.remote(node, None))
            except Exception as e:  # the actor died (RayActorError) or failed
                why = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e) else ''}"
                left = ray.get(self.server.node_lost.remote(node, why))
                print(f"iasgd: node {node} lost ({type(e).__name__}); {left} "
                      f"node{'s' if left != 1 else ''} go on", file=sys.stderr, flush=True)
        return bool(self.running)

    def _params(self) -> np.ndarray:
        return self.ray.get(self.server.get_params.remote())

    def record_epoch(self, hooks: Hooks, applied: int) -> None:
        r, cfg = self.result, self.cfg
        r.train_time_s += self.epoch_time
        r.samples += applied * cfg.batch_size
        taken = self.ray.get(self.server.take_epoch.remote())
        self.run_hist += taken["hist"]
        record = record_epoch(r, self.model, self.data, self._params(), epoch=self.epoch,
                              applied=applied, quota=self.quota, batch_size=cfg.batch_size,
                              seconds=self.epoch_time, loss_sum=taken["loss_sum"],
                              hist=taken["hist"], end_s=r.train_time_s)
        if cfg.eval_every:
            record_eval(r, self.model, self.data, self._params(), seconds=r.train_time_s,
                        applied=(self.epoch - 1) * self.quota + applied,
                        accuracy=record.test_accuracy)
        hooks.on_epoch_end(record)

    def next_epoch(self) -> None:
        self.epoch, self.epoch_time = self.epoch + 1, 0.0

    def finish(self) -> None:
        """Bring the run-wide figures up to date from the server (and the
        nodes' figures once they have ended)."""
        r = self.result
        server = self.ray.get(self.server.summary.remote())
        r.params = self._params()
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
        }

    def _shutdown(self) -> None:
        """Stop the server and the nodes, collect the nodes' figures, and
        free the actors."""
        ray = self.ray
        gone = ray.exceptions.RayError  # the server or a node died: go on without it
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
            ray.kill(h)
