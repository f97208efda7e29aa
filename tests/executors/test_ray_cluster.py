"""The Ray executor (iasgd.executors.ray_cluster) on a two-node Ray cluster started on
this machine (ray.cluster_utils.Cluster), shared by the tests of this module:
every algorithm with both staleness bounds, lost nodes, a lost parameter
server (started again, or saved when it cannot be), and the command line's
errors."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from iasgd import data as datasets  # noqa: E402
from iasgd import engine, run  # noqa: E402
from iasgd.config import config_where_it_applies  # noqa: E402
from iasgd.executors import ray_cluster as R  # noqa: E402
from iasgd.nn import models  # noqa: E402

BATCH, N_TRAIN = 8, 800  # 100 updates an epoch


@pytest.fixture(scope="module")
def cluster():
    # nodes that train at nice 0, as a local Ray of iasgd's has them (Ray's
    # default, 15, starves them on a busy machine: R.LOCAL_RAY_CONFIG)
    c = Cluster(initialize_head=True,
                head_node_args={"num_cpus": 2, "_system_config": R.LOCAL_RAY_CONFIG})
    c.add_node(num_cpus=2)
    ray.init(address=c.address, configure_logging=False, log_to_driver=False)
    yield c
    ray.shutdown()
    c.shutdown()


def test_the_nodes_train_at_normal_priority(cluster):
    """Workers on both machines of the test cluster run at nice 0 (Ray's
    default is 15)."""
    @ray.remote(num_cpus=2)
    def niceness() -> tuple[str, int]:
        return ray.get_runtime_context().get_node_id(), os.getpriority(os.PRIO_PROCESS, 0)

    seen = dict(ray.get([niceness.options(scheduling_strategy="SPREAD").remote()
                         for _ in range(2)]))
    assert set(seen.values()) == {0}, seen


@pytest.fixture(scope="module")
def problem():
    return (models.build("lenet", "synthetic"),
            datasets.synthetic(seed=0, n_train=N_TRAIN, n_test=200))


def config(**kw) -> engine.TrainConfig:
    base = {"algo": "interval", "backend": "ray", "nodes": 2, "threads": 2, "sync_every": 4,
            "batch_size": BATCH, "epochs": 2, "lr": 0.01, "interval": 3, "node_interval": 2}
    return config_where_it_applies(**{**base, **kw})


@pytest.mark.parametrize("algo,gate", [("sync", "wait"), ("async", "wait"), ("hogwild", "wait"),
                                       ("interval", "wait"), ("interval", "drop")])
def test_every_algorithm_runs_on_two_ray_nodes_within_both_bounds(cluster, problem, algo, gate):
    model, data = problem
    r = engine.train(model, data, config(algo=algo, gate=gate, node_gate=gate))
    assert r.status == "completed" and len(r.epochs) == 2
    assert r.applied == 2 * N_TRAIN // BATCH  # every ticket of both epochs reached the server
    c = r.cluster
    nodes = c["nodes"]
    assert [n["node"] for n in nodes] == [0, 1]
    assert len({n["ray_node"] for n in nodes}) == 2  # one on each Ray node (SPREAD)
    assert c["server"]["pushes"] > 0 and c["bytes_per_sample"] > 0
    assert r.bound_violations == 0
    inside, between = r.staleness_bound, c["node_staleness"]
    for n in nodes:
        assert n["applied"] > 0 and n["samples_per_s"] > 0 and n["rtt_ms_p50"] > 0
        st = n["staleness"]
        if algo == "interval":  # inside a node: y - 1 of its threads' intervals
            assert st["bound"] == 2 and st["max"] <= 2
        if algo == "sync":
            assert st["max"] == 0
    if algo == "interval":
        assert inside == 2 and between["bound"] == 1 and between["max"] <= 1
    elif algo == "sync":
        assert inside == 0 and between["bound"] == 0 and between["max"] == 0
    else:
        assert inside is None and between["bound"] is None
    assert sum(between["hist"]) == c["server"]["pushes"]
    assert 0 < r.epochs[-1].test_accuracy <= 1


def run_in_thread(model, data, cfg, hooks=None):
    """A RayRun started in a thread: (the run, its thread, [result or error])."""
    rr = R.RayRun(model, data, cfg)
    out: list = []

    def go():
        try:
            out.append(rr.run(hooks or engine.Hooks()))
        except Exception as e:
            out.append(e)

    t = threading.Thread(target=go)
    t.start()
    return rr, t, out


def wait_until_applied(rr: R.RayRun, n: int) -> None:
    deadline = time.monotonic() + 120
    while ray.get(rr.server.progress.remote())["done"] < n:
        assert time.monotonic() < deadline, "the run made no progress"
        time.sleep(0.02)


def test_a_killed_node_does_not_lose_the_run(cluster, problem, capsys):
    model, data = problem
    rr, t, out = run_in_thread(model, data, config(algo="interval", epochs=4))
    wait_until_applied(rr, 40)
    ray.kill(rr.handles[1])
    t.join(180)
    r = out[0]
    assert r.status == "completed" and r.applied == 4 * N_TRAIN // BATCH
    lost = r.cluster["server"]["lost_nodes"]
    assert [x["node"] for x in lost] == [1] and "Actor" in lost[0]["why"]
    assert [n["node"] for n in r.cluster["nodes"]] == [0]
    assert r.bound_violations == 0
    assert "node 1 lost" in capsys.readouterr().err


def test_losing_every_node_stops_with_a_checkpoint_and_a_clear_error(cluster, problem):
    model, data = problem
    saved = []
    hooks = engine.Hooks(on_checkpoint=saved.append)
    rr, t, out = run_in_thread(model, data, config(algo="hogwild", epochs=50), hooks)
    wait_until_applied(rr, 20)
    for h in rr.handles:
        ray.kill(h)
    t.join(180)
    assert isinstance(out[0], R.ClusterError) and "every node was lost" in str(out[0])
    assert out[0].exit_code == 1
    assert saved and np.all(np.isfinite(saved[-1].arrays["params"]))
    assert saved[-1].meta["server"]["pushes"] > 0


def ray_node_of(actor) -> str:
    """The Ray node an actor runs on."""
    return ray.get(actor.__ray_call__.remote(lambda _: ray.get_runtime_context().get_node_id()))


@pytest.mark.parametrize("algo", ["interval", "sync"])
def test_a_killed_server_is_started_again_and_the_run_goes_on(cluster, problem, algo, capsys):
    model, data = problem
    cfg = config(algo=algo, epochs=4)
    rr, t, out = run_in_thread(model, data, cfg)
    here = ray.get_runtime_context().get_node_id()
    assert ray_node_of(rr.server) == here  # on the driver's node, never on another
    wait_until_applied(rr, 40)
    ray.kill(rr.server)  # mid-run
    t.join(240)
    r = out[0]
    assert not isinstance(r, Exception), r
    assert r.status == "completed" and [e.epoch for e in r.epochs] == [1, 2, 3, 4]
    assert r.applied == 4 * N_TRAIN // BATCH  # the lost updates' tickets came back
    c = r.cluster
    assert c["server_restarts"] == 1 and c["server_node"] == here
    # at most one push in flight per node, of at most 2K updates (K with sync)
    assert 0 <= c["lost_updates"] <= 2 * cfg.sync_every * cfg.nodes
    assert c["restarts"][0]["lost_updates"] == c["lost_updates"]
    assert [(n["node"], n["rejoins"]) for n in c["nodes"]] == [(0, 1), (1, 1)]
    assert r.bound_violations == 0 and c["node_staleness"]["violations"] == 0
    if algo == "interval":
        assert c["node_staleness"]["max"] <= 1
    else:
        assert c["node_staleness"]["max"] == 0
    err = capsys.readouterr().err
    assert err.count("iasgd: parameter server lost") == 1 and "node 0 lost" not in err


def test_a_server_that_cannot_be_started_again_leaves_a_checkpoint_and_results(
        cluster, problem):
    model, data = problem
    saved = []
    hooks = engine.Hooks(on_checkpoint=saved.append)
    rr, t, out = run_in_thread(model, data, config(algo="hogwild", epochs=50), hooks)
    wait_until_applied(rr, 150)  # epoch 1 is recorded

    def no_room(params):
        raise RuntimeError("no room for it")

    rr._new_server = no_room
    ray.kill(rr.server)
    t.join(180)
    error = out[0]
    assert isinstance(error, R.ClusterError) and error.exit_code == 1
    message = str(error)
    assert "parameter server was lost" in message and "no room for it" in message
    assert "checkpoint is saved" in message and "\n" not in message
    r = error.result
    assert r.status == "server_lost" and len(r.epochs) >= 1
    assert "no room" in r.cluster["server_lost"]
    snap = saved[-1]
    assert snap.meta["result"]["status"] == "server_lost"
    assert snap.meta["epoch"] == len(r.epochs) + 1  # the copy of the last epoch's end
    np.testing.assert_array_equal(r.params, snap.arrays["params"])
    # the checkpoint continues the run: the next epoch, every update of it
    epochs = snap.meta["epoch"]
    again = engine.train(model, data, config(algo="hogwild", epochs=epochs), resume=snap)
    assert [e.epoch for e in again.epochs] == list(range(1, epochs + 1))
    assert again.applied == epochs * N_TRAIN // BATCH


def test_a_diverging_node_stops_the_run_as_diverged(cluster, problem):
    model, data = problem
    r = engine.train(model, data, config(algo="hogwild", lr=1e4, epochs=20))
    assert r.status == "diverged" and r.diverged_at["epoch"] == 1
    assert len(r.epochs) == 1  # the cut epoch is recorded, as on one machine


def test_a_resumed_cluster_run_continues_from_the_server_state(cluster, problem):
    model, data = problem
    saved = []
    first = engine.train(model, data, config(algo="hogwild", epochs=1),
                         engine.Hooks(on_checkpoint=saved.append))
    again = engine.train(model, data, config(algo="hogwild", epochs=2), resume=saved[-1])
    assert [e.epoch for e in again.epochs] == [1, 2]
    assert again.applied == 2 * N_TRAIN // BATCH and first.applied == N_TRAIN // BATCH
    assert again.epochs[0] == first.epochs[0]


def test_the_command_line_says_in_one_line_when_ray_is_missing(monkeypatch, capsys):
    real = run.importlib.util.find_spec
    monkeypatch.setattr(run.importlib.util, "find_spec",
                        lambda name, *a: None if name == "ray" else real(name, *a))
    code = run.main(["--backend", "ray", "--algo", "hogwild", "--dataset", "synthetic"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "pip install -e '.[ray]'" in err


@pytest.mark.parametrize("argv,message", [
    (["--address", "127.0.0.1:9"], "cannot reach the Ray cluster at 127.0.0.1:9"),
    (["--backend", "threads", "--address", "auto"], "--address applies to --backend ray"),
    (["--algo", "sequential"], "--backend ray runs a parallel --algo"),
    (["--simulate"], "drop --backend ray or --simulate"),
])
def test_bad_cluster_options_are_one_line_and_exit_2(argv, message, capsys, tmp_path):
    base = ["--backend", "ray", "--algo", "hogwild", "--dataset", "synthetic",
            "--out", str(tmp_path / "r.json")]
    code = run.main([*base, *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err


# bench/cluster.py: the Ray backend against the threaded engine, and its projection
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import cluster as bench_cluster  # noqa: E402


def test_bench_cluster_quick_compares_ray_nodes_with_threads(cluster, tmp_path):
    doc = bench_cluster.main(["--quick", "--project", "--name", "smoke",
                              "--out-dir", str(tmp_path)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smoke.json", "smoke.md"]
    summary = doc["summary"]
    assert list(summary) == ["threads-2", "ray-2x1-K4"]
    assert all(s["samples_per_s"] > 0 for s in summary.values())
    ray_run = doc["runs"]["ray-2x1-K4"][0]
    assert ray_run["pushes"] > 0 and ray_run["bytes_per_sample"] > 0
    assert len(ray_run["nodes"]) == 2
    assert [c["nodes"] for c in doc["projection"]["clusters"]] == [8, 64]
    table = (tmp_path / "smoke.md").read_text()
    assert "| threads-2 |" in table and "| ray-2x1-K4 |" in table
    assert "## Projection on paper" in table


def test_bench_cluster_projection_by_hand():
    # 8 nodes x 16 cores x 1,000 samples/s = 128,000 samples/s = 8,000 updates/s at b=16;
    # a push is 4 MB each way; K=16: 500 pushes/s = 2 GB/s (160% of 1.25 GB/s), 50% CPU
    # at 1 ms a push; K=64: 125 pushes/s, 40% network, 12.5% CPU: the smallest below 50%
    p = bench_cluster.project(1000.0, 16, 1_000_000, 1e-3, nodes=8, cores_per_node=16,
                              ks=(16, 64, 256))
    assert p["samples_per_s"] == 128_000 and p["updates_per_s"] == 8_000
    assert p["bytes_per_exchange"] == 8_000_000
    k16, k64, _ = p["rows"]
    assert k16["pushes_per_s"] == 500 and k16["network_busy"] == pytest.approx(1.6)
    assert k16["cpu_busy"] == pytest.approx(0.5)
    assert k64["network_busy"] == pytest.approx(0.4) and k64["cpu_busy"] == pytest.approx(0.125)
    assert p["smallest_k"] == 64
    assert p["k_at_limit"] == pytest.approx(51.2)  # 8,000 x 3.2 ms (the network's) / 0.5


def test_ctrl_c_saves_the_run_and_exits_130(cluster, tmp_path):
    """A real SIGINT to a command-line run that joined the module's cluster."""
    import os
    import signal
    import subprocess
    import sys

    out = tmp_path / "r.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "iasgd.run", "--backend", "ray", "--address", cluster.address,
         "--algo", "interval", "--dataset", "synthetic", "--threads", "1", "--epochs", "1000",
         "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()})
    deadline = time.monotonic() + 120
    for line in proc.stdout:  # the first epoch's line: the nodes are training
        if line.startswith("epoch") or time.monotonic() > deadline:
            break
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "interrupted; checkpoint in" in err
    assert (tmp_path / "r.ckpt.h5").exists()
    doc = __import__("json").loads(out.read_text())
    assert doc["status"] == "interrupted" and doc["backend"] == "ray"


# each node's threads draw their own batches (tests/executors/test_worker_streams.py
# pins the seeds, and nodes in one process): on Ray, read from the node actors
from test_worker_streams import assert_apart, first_state  # noqa: E402

from iasgd.executors import cluster as C  # noqa: E402
from iasgd.protocol import workers as W  # noqa: E402


class WatchedRun(R.RayRun):
    """A RayRun that, before it shuts its nodes down, reads where each
    node's threads' random streams started: [(node's seed, [first state
    of each thread's stream])], from its state now and the steps its
    threads computed (b draws each)."""

    def end_run(self) -> None:
        read = [h.__ray_call__.remote(lambda actor: (
            actor.inner.local_cfg.seed, actor.inner.team.rngs[:, 0].copy(),
            actor.inner.team.counters[:, W.COMPUTED].copy())) for h in self.handles]
        self.streams = [(seed, [first_state(last, BATCH * int(steps))
                                for last, steps in zip(rngs, computed, strict=True)])
                        for seed, rngs, computed in ray.get(read)]
        super().end_run()


def test_the_threads_of_every_ray_node_train_on_their_own_streams(cluster, problem):
    """Two Ray nodes of two threads, one epoch: each node's threads drew
    from the streams of its own seed (node_seed of the run's seed), and no
    thread of a node trains on the batches of another's."""
    model, data = problem
    seed = 3
    rr = WatchedRun(model, data, config(epochs=1, seed=seed))
    assert rr.run(engine.Hooks()).status == "completed"
    firsts = []
    for i, (node_seed, mine) in enumerate(rr.streams):
        assert node_seed == C.node_seed(seed, i)
        assert mine == [int(W.stream_seed(node_seed, w, 0)) for w in range(2)]
        firsts += mine
    assert_apart(firsts, count=N_TRAIN, b=BATCH)


def test_a_resumed_ray_runs_nodes_draw_new_batches(cluster, problem):
    """A resume starts the nodes afresh: their threads draw from the streams
    of the resumed segment (stream_seed's segment 1), not again the batches
    the run drew before it was saved."""
    model, data = problem
    saved = []
    first = WatchedRun(model, data, config(algo="hogwild", epochs=1))
    first.run(engine.Hooks(on_checkpoint=saved.append))
    again = WatchedRun(model, data, config(algo="hogwild", epochs=2), resume=saved[-1])
    assert again.run(engine.Hooks()).status == "completed"
    for i, (node_seed, mine) in enumerate(again.streams):
        assert node_seed == C.node_seed(0, i)
        assert mine == [int(W.stream_seed(node_seed, w, 1)) for w in range(2)]
    assert_apart([s for _, streams in first.streams + again.streams for s in streams],
                 count=N_TRAIN, b=BATCH)
