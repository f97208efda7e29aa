"""Fingerprints of every deterministic run, to show a refactoring changed no bit.

Prints one line per run: its name, the sha256 (first 16 hex digits) of its
final parameters and of its staleness histogram. Runs (small synthetic data,
so the whole script takes a minute or two once compiled):

- sequential training of every preset at its datasets' shapes, and of user
  specs that use every layer kind and conv path (direct 3x3/5x5, GEMM, the
  explicit vectors, same/valid padding, fused ReLU + pool, flatten, batch
  norm alone and fused into the pool, the average and global pools);
- the forward logits and the float32 gradient of each of those models;
- every variant the simulator covers, on 8 simulated workers;
- every parallel algorithm and gate policy on one real thread (one thread is
  deterministic: its schedule is the only one).

Compare two commits with `diff`:

    git stash; python bench/identity.py > /tmp/before.txt; git stash pop
    python bench/identity.py > /tmp/after.txt; diff /tmp/before.txt /tmp/after.txt

Ray's node runs are not here: their exchanges overlap training, so even one
node's result depends on timing (tests/executors/test_cluster.py checks the
cluster's arithmetic step by step).
"""

from __future__ import annotations

import argparse
import hashlib

import numpy as np

from iasgd import data as datasets
from iasgd import engine
from iasgd.algorithms import ALGORITHMS, VARIANTS
from iasgd.config import config_where_it_applies
from iasgd.executors import simulated as sim
from iasgd.nn import models

# (name, model, input shape, classes)
MODELS = [
    ("lenet-cifar10", "lenet", (3, 32, 32), 10),
    ("lenet-cifar100", "lenet", (3, 32, 32), 100),
    ("lenet-fashion", "lenet", (1, 28, 28), 10),
    ("mlp-cifar10", "mlp", (3, 32, 32), 10),
    ("vgg-small", "vgg-small", (3, 32, 32), 10),
    ("spec-gemm-k7-k1", "conv8k7s,relu,pool,conv16k1,relu,dense", (3, 16, 16), 10),
    ("spec-k5-simd", "conv16k5s,relu,pool,conv32k5,pool,relu,flatten,dense24,dense",
     (4, 20, 20), 5),
    ("spec-k3-valid", "conv8k3,pool,conv16k3s,relu,conv32k3s,relu,pool,dense16,relu,dense",
     (2, 18, 18), 3),
    ("spec-relu-alone", "relu,conv6k3s,relu,flatten,relu,dense", (1, 9, 9), 4),
    # batch norm: in the pool's row (vgg-bn), on the input, with its own ReLU
    # before an average pool, on a vector; the global pool
    ("vgg-bn", "vgg-bn", (3, 32, 32), 10),
    ("spec-bn-rows", "bn,conv6k3s,bn,relu,avgpool,conv8k3,relu,gap,bn,dense", (2, 12, 12), 4),
]


def fingerprint(values: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(values).tobytes()).hexdigest()[:16]


def small_data(shape: tuple[int, int, int], classes: int, n_train: int = 192) -> datasets.Dataset:
    return datasets.synthetic(seed=3, n_train=n_train, n_test=32, shape=shape,
                              num_classes=classes)


def line(name: str, result: engine.RunResult) -> str:
    return (f"{name:<34} params {fingerprint(result.params)}  "
            f"staleness {fingerprint(np.asarray(result.staleness_hist))}  "
            f"applied {result.applied}")


def sequential_runs() -> list[str]:
    out = []
    for name, spec, shape, classes in MODELS:
        model = models.build(spec, input_shape=shape, num_classes=classes)
        data = small_data(shape, classes)
        cfg = engine.TrainConfig(epochs=2, batch_size=12, lr=0.01, seed=1)
        out.append(line(f"sequential {name}", engine.train(model, data, cfg)))
        params = model.init(7)
        x = data.x_train[:20].astype(np.float32) / 255
        out.append(f"{'logits ' + name:<34} {fingerprint(model.logits(params, x))}")
        loss, grad = model.loss_and_grad(params, x, data.y_train[:20])
        out.append(f"{'gradient ' + name:<34} {fingerprint(grad)} loss {loss!r}")
    return out


def simulated_runs() -> list[str]:
    model = models.build("lenet", input_shape=(3, 32, 32), num_classes=10)
    data = small_data((3, 32, 32), 10, n_train=480)
    out = []
    for variant, fields in VARIANTS.items():
        algo = ALGORITHMS[str(fields["algo"])]
        if not algo.simulated:
            continue
        cfg = config_where_it_applies(variant=variant, threads=8, epochs=2, batch_size=8,
                                      lr=0.01, seed=2, y0=8, decay_every=16, probe_steps=8,
                                      exec_steps=16, probe_offset=4, probe_step=2)
        result = sim.simulate(model, data, cfg, sim.lognormal_steps(0.002, 0.3))
        out.append(line(f"simulated {variant}", result))
    return out


def one_thread_runs() -> list[str]:
    model = models.build("lenet", input_shape=(3, 32, 32), num_classes=10)
    data = small_data((3, 32, 32), 10)
    out = []
    for algo in ALGORITHMS.values():
        if not algo.parallel:
            continue
        gates = ("wait", "drop") if algo.name == "interval" else ("wait",)
        for gate in gates:
            cfg = config_where_it_applies(algo=algo.name, gate=gate, threads=1, epochs=2,
                                          batch_size=8, lr=0.01, seed=4, interval=4)
            out.append(line(f"threads-1 {algo.name}/{gate}", engine.train(model, data, cfg)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("sequential", "simulated", "threads"),
                        help="one group of runs")
    args = parser.parse_args()
    groups = {"sequential": sequential_runs, "simulated": simulated_runs,
              "threads": one_thread_runs}
    for name, runs in groups.items():
        if args.only in (None, name):
            for text in runs():
                print(text, flush=True)


if __name__ == "__main__":
    main()
