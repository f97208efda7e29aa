"""iasgd.torch against PyTorch's plain Hogwild! loop, side by side in one run.

    python bench/torch_gate.py throughput [--seconds 20] [--repeats 3]
    python bench/torch_gate.py accuracy [--processes 16] [--seeds 0 1 2]
                               [--models lenet resnet] [--seconds 300]
    (--archive PATH/cifar-10-python.tar.gz where ./data has no CIFAR-10)

throughput: 2 processes train LeNet-5 on CIFAR-10 batches (b = 16, lr
0.005, momentum 0.5) for --seconds after a warm-up, as PyTorch's Hogwild!
example does (model.share_memory(), each process its own torch.optim.SGD),
once with no gate and once with every step inside `gate.step()` of the
interval-budget gate (IntervalGate.budget: y = 64 for 2 processes). The
arms alternate, --repeats times each; prints samples/s and the ratio
gate / plain (goal: >= 0.97).

accuracy: --processes processes (16: the staleness many cores bring; on 2
cores they take turns), CIFAR-10, each model of --models and each seed:
plain Hogwild! against interval-budget (IntervalGate.budget with TAIL-tau
step sizes through step.lr_factor), until --seconds or 60 % test accuracy.
The workers start held, and the clock starts when all of them are ready
(16 processes on 2 cores, once forked, took 11-15 s to get there). Every --eval-s seconds
of training the parent holds the workers between steps and evaluates a copy
of the shared model on the whole test set, on every core; the clock stops
meanwhile (with the workers running, an evaluation on 2 cores took 10 s for
LeNet-5 and 80-110 s for the ResNet, which set the times' resolution). Each
run records its start-up and each hold's drain (the steps under way
finishing, counted as training time). Prints time to 55 % and
60 % per run and the ratio of the medians (goal: <= 0.8), and checks that
every gated run's staleness max is <= y - 1. Results: bench/results/
torch-gate-<mode>.json (--out). A long run (2 models x 3 seeds x 2 arms x
--seconds): for a quiet machine. The runs in docs/pytorch.md:

    python bench/torch_gate.py accuracy --models lenet \
        --out bench/results/torch-gate-accuracy-lenet.json
    python bench/torch_gate.py accuracy --models lenet --lr 0.02 --seconds 300 \
        --out bench/results/torch-gate-accuracy-lenet-lr0.02.json
    python bench/torch_gate.py accuracy --models lenet --lr 0.01 --seconds 300 \
        --out bench/results/torch-gate-accuracy-lenet-lr0.01.json
    python bench/torch_gate.py accuracy --models lenet --lr 0.01 --seconds 300 --eval-s 2.5 \
        --out bench/results/torch-gate-accuracy-lenet-lr0.01-eval2.5.json
    python bench/torch_gate.py accuracy --models resnet --eval-s 10 \
        --out bench/results/torch-gate-accuracy-resnet.json
    python bench/torch_gate.py accuracy --models resnet --lr 0.01 --eval-s 10 --seconds 300 \
        --out bench/results/torch-gate-accuracy-resnet-lr0.01.json

(the ResNet file is from before the held start: its clock includes the
start-up, which its first evaluation, at 0 updates, measures; docs/pytorch.md
subtracts it.)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.multiprocessing as mp
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import iasgd.torch as it
from iasgd import data as datasets
from iasgd.protocol import gate as G

RESULTS = Path(__file__).resolve().parent / "results"
MEAN = torch.tensor([0.4914, 0.4822, 0.4465]).view(1, 3, 1, 1)
STD = torch.tensor([0.2470, 0.2435, 0.2616]).view(1, 3, 1, 1)


class LeNet5(nn.Module):
    """The paper's CIFAR-10 model (52,202 parameters)."""

    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, 6, 5), nn.Conv2d(6, 16, 5)
        self.fc1, self.fc2 = nn.Linear(400, 120), nn.Linear(120, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.skip = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                   nn.BatchNorm2d(cout)) if stride != 1 or cin != cout
                     else nn.Identity())

    def forward(self, x):
        return F.relu(self.b2(self.c2(F.relu(self.b1(self.c1(x))))) + self.skip(x))


class SmallResNet(nn.Module):
    """A ResNet-8 of the user's kind: conv 16, three stages of one basic
    block (16, 32, 64 channels, batch norm), global average pool, linear."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16),
                                  nn.ReLU())
        self.stages = nn.Sequential(Block(16, 16, 1), Block(16, 32, 2), Block(32, 64, 2))
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc(F.adaptive_avg_pool2d(self.stages(self.stem(x)), 1).flatten(1))


MODELS = {"lenet": LeNet5, "resnet": SmallResNet}


def batch(images, labels, b, g):
    idx = torch.randint(0, images.shape[0], (b,), generator=g)
    return (images[idx].float().div_(255) - MEAN) / STD, labels[idx]


def may_step(flags, rank: int) -> bool:
    """A worker between steps: waits while flags.pause is set, saying so in
    flags.parked[rank]; whether it may take another step (not flags.stop)."""
    while flags.pause[0] and not flags.stop[0]:
        flags.parked[rank] = 1
        while flags.pause[0] and not flags.stop[0]:
            time.sleep(0.002)
        flags.parked[rank] = 0  # then pause is read again: a hold may have begun
    return not flags.stop[0]


def worker(rank, model, gate, images, labels, flags, cfg):
    """PyTorch's Hogwild! train loop (random batches of its own); with a
    gate, each step inside gate.step(). flags.counts[rank]: steps applied;
    between steps the worker stops for good at flags.stop, and waits while
    flags.pause is set, saying so in flags.parked[rank]."""
    g = torch.Generator().manual_seed(cfg["seed"] * 1000 + rank)
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=cfg["momentum"])
    model.train()
    while may_step(flags, rank):
        x, y = batch(images, labels, cfg["b"], g)
        if gate is None:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            flags.counts[rank] += 1
            continue
        with gate.step() as step:
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            if step.apply(opt.step, scale_lr=opt):
                flags.counts[rank] += 1


@dataclass
class Flags:
    """What the parent and its n workers share: steps applied per worker,
    the stop and pause flags, and which workers the pause holds."""

    counts: torch.Tensor
    stop: torch.Tensor
    pause: torch.Tensor
    parked: torch.Tensor

    @classmethod
    def shared(cls, n: int) -> Flags:
        return cls(*(torch.zeros(k, dtype=torch.int64).share_memory_() for k in (n, 1, 1, n)))

    def hold(self, timeout_s: float = 60.0) -> float:
        """Pause the workers and wait until each is between steps (a step
        under way finishes first); returns the seconds that took. Raises
        TimeoutError after timeout_s."""
        self.pause[0] = 1
        t0 = time.perf_counter()
        while int(self.parked.sum()) < self.parked.numel():
            if time.perf_counter() - t0 > timeout_s:
                raise TimeoutError(f"{int(self.parked.sum())} of {self.parked.numel()} "
                                   f"workers held after {timeout_s:g} s")
            time.sleep(0.002)
        return time.perf_counter() - t0

    def release(self) -> None:
        self.pause[0] = 0


def start(n, model, gate, images, labels, cfg, held=False):
    """n worker processes; returns (processes, their Flags). held: each
    worker waits before its first step until flags.release()."""
    ctx = mp.get_context("fork")
    flags = Flags.shared(n)
    flags.pause[0] = int(held)
    procs = []
    for rank in range(n):
        p = ctx.Process(target=_run_one, args=(rank, model, gate, images, labels, flags, cfg))
        p.start()
        procs.append(p)
    return procs, flags


def _run_one(rank, model, gate, images, labels, flags, cfg):
    torch.set_num_threads(1)
    with contextlib.suppress(it.Stopped):
        worker(rank, model, gate, images, labels, flags, cfg)


def finish(procs, gate, flags, check: bool = True) -> None:
    """Stop the workers (each leaves at its next step, or from a hold), join
    them, terminating any still there after 60 s; check: that every one
    exited with 0."""
    flags.stop[0] = 1
    if gate is not None:
        gate.stop()
    for p in procs:
        p.join(timeout=60)
        if p.is_alive():
            p.terminate()
            p.join()
    failed = [p.exitcode for p in procs if p.exitcode != 0]
    assert not check or not failed, f"workers failed: exit codes {failed}"


def load_cifar(archive):
    data = datasets.load("cifar10", archive=archive)
    return (torch.from_numpy(data.x_train).share_memory_(),
            torch.from_numpy(data.y_train).share_memory_(),
            torch.from_numpy(data.x_test), torch.from_numpy(data.y_test))


def throughput(args) -> dict:
    images, labels, _, _ = load_cifar(args.archive)
    cfg = {"lr": 0.005, "momentum": 0.5, "b": 16, "seed": 0}
    n = 2
    rates = {"plain": [], "gate": []}
    ys = []
    for rep in range(args.repeats):
        for arm in ("plain", "gate"):
            torch.manual_seed(rep)
            model = LeNet5().share_memory()
            gate = (it.IntervalGate.budget(cfg["lr"], cfg["momentum"], n) if arm == "gate"
                    else None)
            if gate is not None:
                gate.warm()
                ys.append(int(gate.state[G.Y]))
            procs, flags = start(n, model, gate, images, labels, cfg)
            time.sleep(args.warm)
            c0, t0 = int(flags.counts.sum()), time.perf_counter()
            time.sleep(args.seconds)
            c1, t1 = int(flags.counts.sum()), time.perf_counter()
            finish(procs, gate, flags)
            rate = (c1 - c0) * cfg["b"] / (t1 - t0)
            rates[arm].append(rate)
            extra = ""
            if gate is not None:
                r = gate.report()
                extra = f" (y {ys[-1]}, staleness max {r.staleness_max}, violations " \
                        f"{r.bound_violations})"
                assert r.bound_violations == 0 and r.staleness_max <= ys[-1] - 1
            print(f"repeat {rep} {arm:5s}: {rate:8.0f} samples/s{extra}", flush=True)
    ratio = statistics.median(rates["gate"]) / statistics.median(rates["plain"])
    pairs = [g / p for g, p in zip(rates["gate"], rates["plain"], strict=True)]
    print(f"median samples/s: plain {statistics.median(rates['plain']):.0f}, gate "
          f"{statistics.median(rates['gate']):.0f}; ratio {ratio:.3f} (per repeat "
          f"{', '.join(f'{p:.3f}' for p in pairs)}; goal >= 0.97)")
    return {"processes": n, "seconds": args.seconds, "warm_s": args.warm, "config": cfg,
            "y": ys, "samples_per_s": rates, "ratio_of_medians": ratio, "ratios": pairs}


def evaluate(model_cls, shared, x_test, y_test) -> float:
    """Test accuracy of a copy of `shared`, on every core: the workers are
    held meanwhile (each sets its own single thread, so the next run's
    forked workers still compute on one thread each)."""
    model = model_cls()
    model.load_state_dict(shared.state_dict())
    model.eval()
    correct = 0
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        with torch.no_grad():
            for i in range(0, x_test.shape[0], 1000):
                x = (x_test[i:i + 1000].float().div_(255) - MEAN) / STD
                correct += int((model(x).argmax(1) == y_test[i:i + 1000]).sum())
    finally:
        torch.set_num_threads(threads)
    return correct / x_test.shape[0]


def train_to_60(flags, gate, cls, model, x_test, y_test, args):
    """Release the held workers, evaluate every args.eval_s seconds of
    training until 60 % or args.seconds; returns (start-up seconds, evals
    [[t, updates, accuracy, drain seconds], ...], {target: t})."""
    # 16 forked processes take seconds to reach their first step on 2
    # cores: they start held, and the clock starts when every one is ready
    startup_s = flags.hold()
    # the clock runs while the workers train: each evaluation holds them
    # between steps, so it neither competes with them for the cores nor
    # counts as training time (the drain, the steps under way finishing, does)
    t, evals, reached = 0.0, [], {}
    while t < args.seconds:
        resumed = time.perf_counter()
        flags.release()
        time.sleep(args.eval_s)
        drain_s = flags.hold()
        t += time.perf_counter() - resumed
        acc = evaluate(cls, model, x_test, y_test)
        evals.append([t, int(flags.counts.sum()), acc, drain_s])
        for target in (0.55, 0.60):
            if acc >= target and target not in reached:
                reached[target] = t
        if gate is not None:
            gate.tick()  # the TAIL-tau factors
        if 0.60 in reached:
            break
    return startup_s, evals, reached


def accuracy(args) -> dict:
    images, labels, x_test, y_test = load_cifar(args.archive)
    torch.set_num_threads(1)
    runs = []
    for name in args.models:
        for seed in args.seeds:
            for arm in ("plain", "interval-budget"):
                cfg = {"lr": args.lr, "momentum": args.momentum, "b": 16, "seed": seed}
                torch.manual_seed(seed)
                model = MODELS[name]().share_memory()
                gate = None
                if arm != "plain":
                    gate = it.IntervalGate.budget(args.lr, args.momentum, args.processes,
                                                  lr_schedule="tail")
                    gate.warm()
                procs, flags = start(args.processes, model, gate, images, labels, cfg,
                                     held=True)
                try:
                    startup_s, evals, reached = train_to_60(flags, gate, MODELS[name], model,
                                                            x_test, y_test, args)
                except BaseException:
                    finish(procs, gate, flags, check=False)  # no worker left waiting
                    raise
                finish(procs, gate, flags)
                run = {"model": name, "seed": seed, "arm": arm, "startup_s": startup_s,
                       "evals": evals,
                       "to_55": reached.get(0.55), "to_60": reached.get(0.60)}
                if gate is not None:
                    r = gate.report()
                    y = int(gate.state[G.Y])
                    run.update(y=y, staleness_max=r.staleness_max,
                               staleness_mean=r.staleness_mean, violations=r.bound_violations)
                    assert r.bound_violations == 0 and r.staleness_max <= y - 1, run
                runs.append(run)
                print(f"{name} seed {seed} {arm:15s}: to 55 % {run['to_55']}, to 60 % "
                      f"{run['to_60']}, best {max(e[2] for e in evals):.3f}"
                      + (f", y {run['y']}, staleness max {run['staleness_max']}"
                         if gate is not None else ""), flush=True)
    summary = summarise(runs, args.models, args.seconds)
    for key, row in summary.items():
        bound = "" if row["ratio"] is None or row["ratio_exact"] else "below "
        print(f"{key}: plain {row['times']['plain']}, interval-budget "
              f"{row['times']['interval-budget']}, ratio of medians {bound}{row['ratio']} "
              "(goal <= 0.8)")
    return {"processes": args.processes, "lr": args.lr, "momentum": args.momentum,
            "seconds": args.seconds, "runs": runs, "summary": summary}


def summarise(runs: list[dict], models: list[str], seconds: float) -> dict:
    """Per model and target: each arm's times (None: not reached within
    `seconds`), the medians counting such a run as slower than any that got
    there, and their ratio gate / plain. Where plain's median run did not
    get there and the gate's did, the ratio is an upper bound (its median
    over `seconds`; ratio_exact false)."""
    summary = {}
    for name in models:
        for target in ("to_55", "to_60"):
            times = {arm: [r[target] for r in runs if r["model"] == name and r["arm"] == arm]
                     for arm in ("plain", "interval-budget")}
            med = {arm: statistics.median(math.inf if t is None else t for t in ts)
                   for arm, ts in times.items()}
            gate, plain = med["interval-budget"], med["plain"]
            exact = math.isfinite(gate) and math.isfinite(plain)
            ratio = gate / plain if exact else gate / seconds if math.isfinite(gate) else None
            summary[f"{name} {target}"] = {
                "times": times, "ratio": ratio, "ratio_exact": exact,
                "medians": {arm: m if math.isfinite(m) else None for arm, m in med.items()}}
    return summary


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", choices=("throughput", "accuracy"))
    p.add_argument("--archive", default=None, help="CIFAR-10 archive (cifar-10-python.tar.gz)")
    p.add_argument("--seconds", type=float, default=None,
                   help="throughput: measured seconds per arm (20); accuracy: the most per run "
                        "(300)")
    p.add_argument("--warm", type=float, default=5.0, help="throughput: seconds before measuring")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--processes", type=int, default=16)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["lenet", "resnet"])
    p.add_argument("--lr", type=float, default=0.005)
    p.add_argument("--momentum", type=float, default=0.5)
    p.add_argument("--eval-s", type=float, default=5.0)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.seconds is None:
        args.seconds = 20.0 if args.mode == "throughput" else 300.0
    result = throughput(args) if args.mode == "throughput" else accuracy(args)
    result.update(mode=args.mode, machine={"cpus": os.cpu_count(),
                                           "torch": torch.__version__},
                  date=time.strftime("%Y-%m-%d"))
    out = Path(args.out or RESULTS / f"torch-gate-{args.mode}.json")
    out.write_text(json.dumps(result, indent=1, default=float))
    print(f"results: {out}")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
