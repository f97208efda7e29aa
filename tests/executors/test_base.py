"""What iasgd.executors.base owns for every executor: the one-thread BLAS
limit (here), the epoch record, the evaluations and the monitor's tick (the
executors' own tests, which now run through it)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from threadpoolctl import threadpool_info

from iasgd import data as datasets
from iasgd import engine
from iasgd.executors import simulated as sim
from iasgd.executors.base import mean_loss
from iasgd.nn import models
from iasgd.results import Hooks

ROOT = Path(__file__).resolve().parents[2]


def blas_threads() -> list[int]:
    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


@pytest.mark.parametrize("algo", ["sequential", "hogwild", "simulated"])
def test_every_executor_trains_and_evaluates_under_the_one_thread_blas_limit(algo):
    data = datasets.synthetic(seed=0, n_train=64, n_test=16)
    model = models.build("lenet", "synthetic")
    seen: list[list[int]] = []
    hooks = Hooks(on_epoch_end=lambda record: seen.append(blas_threads()))
    if algo == "simulated":
        cfg = engine.TrainConfig(algo="hogwild", threads=2, epochs=1, batch_size=8)
        sim.simulate(model, data, cfg, sim.lognormal_steps(0.001, 0.1), hooks=hooks)
    else:
        cfg = engine.TrainConfig(algo=algo, threads=1 + (algo != "sequential"), epochs=1,
                                 batch_size=8)
        engine.train(model, data, cfg, hooks)
    assert seen and seen[0] and set(seen[0]) == {1}


def test_a_ray_node_process_keeps_the_limit_from_its_start():
    """A node actor (iasgd.executors.ray_cluster.NodeActor) takes the limit
    for its whole process before it builds its node: its warm-up and every
    exchange run under it, not only Node.run."""
    code = ("from threadpoolctl import threadpool_info\n"
            "from iasgd.executors.base import one_thread_blas_for_good\n"
            "one_thread_blas_for_good()\n"
            "print(sorted({l['num_threads'] for l in threadpool_info()"
            " if l['user_api'] == 'blas'}))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env={"PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[1]"
    source = (ROOT / "iasgd" / "executors" / "ray_cluster.py").read_text()
    init = source[source.index("class NodeActor"):source.index("self.inner = Node(")]
    assert "one_thread_blas_for_good()" in init


def test_the_mean_loss_of_no_update_is_nan():
    assert mean_loss(6.0, 3) == 2.0
    assert mean_loss(0.0, 0) != mean_loss(0.0, 0)


def schedule_formula(lr: float, warmup: int, planned: int, update: int) -> float:
    """PyTorch's LinearLR warm-up then CosineAnnealingLR, written out."""
    if update < warmup:
        return lr * (update + 1) / warmup
    x = min((update - warmup) / (planned - warmup), 1.0)
    return lr * 0.5 * (1 + math.cos(math.pi * x))


@pytest.mark.parametrize("algo", ["sequential", "hogwild", "simulated"])
def test_each_epoch_records_the_step_size_its_schedule_reached(algo):
    data = datasets.synthetic(seed=0, n_train=64, n_test=16)
    model = models.build("lenet", "synthetic")
    cfg = engine.TrainConfig(algo="sequential" if algo == "sequential" else "hogwild",
                             threads=1 if algo == "sequential" else 2, epochs=3, batch_size=8,
                             lr=0.05, lr_warmup=0.25, lr_decay="cosine")
    if algo == "simulated":
        result = sim.simulate(model, data, cfg, sim.lognormal_steps(0.001, 0.1))
    else:
        result = engine.train(model, data, cfg)
    quota = 64 // 8
    for record in result.epochs:  # every epoch applies its quota of updates here
        last = record.epoch * quota - 1
        assert record.lr == pytest.approx(schedule_formula(0.05, 6, 24, last), rel=1e-6)
    plain = engine.train(model, data, engine.TrainConfig(epochs=2, batch_size=8, lr=0.05))
    assert [r.lr for r in plain.epochs] == [0.05, 0.05]
