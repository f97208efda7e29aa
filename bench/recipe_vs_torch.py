"""Time to a test accuracy: iasgd's recipe against PyTorch with the same
network, recipe, batch size and cores, side by side in one run.

    python bench/recipe_vs_torch.py [--recipe cifar10] [--target 0.80]
        [--archive PATH/cifar-10-python.tar.gz] [--algo interval] [--threads 2]
        [--arms 1-thread 2-threads 2-processes] [--cap 2.0]

iasgd: `python -m iasgd.run --recipe R --algo A --threads T --eval-every U`
in a subprocess; its results JSON gives the training time (evaluation
excluded) at every evaluation.

PyTorch 2.x, one arm each of: 1 thread (torch.set_num_threads(1)), 2
threads, and 2 Hogwild! processes (model.share_memory(), each process its
own optimiser on its half of every epoch, as PyTorch's Hogwild! example).
Everything is built here from the recipe's settings, not by iasgd: the
network from the spec string by this script's own parser (torch.nn
modules, PyTorch's default initialisation), the same augmentation
(random crop of the zero-padded image and horizontal flip, drawn per
sample), torch.optim.SGD with the recipe's momentum, Nesterov and weight
decay, the step size warmed up and decayed per update by a LambdaLR,
cross-entropy with its label smoothing, the same batch size and epochs, the
inputs scaled as iasgd scales them. Each arm is evaluated at every epoch's
end, outside its clock, and stops at the target or once its training time
passes --cap times iasgd's time to the target (then "not by T": a lower
bound of its time).

Prints each arm's time to the target and iasgd's time over the best
PyTorch arm's (goal: <= 0.5); writes bench/results/recipe-vs-torch.json.
Long (minutes per arm): for a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.multiprocessing as mp
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from iasgd import data as datasets
from iasgd.nn import models
from iasgd.recipes import RECIPES
from iasgd.results import time_to_target

RESULTS = Path(__file__).resolve().parent / "results"
MEAN, STD = 0.5, 0.5  # iasgd's input transform: (x / 255 - 0.5) / 0.5


# ------------------------------------------------------------- the network


def torch_layers(spec: str, shape: tuple[int, int, int], classes: int) -> nn.Sequential:
    """The spec's layers as torch modules (this script's own reading of the
    grammar in docs/models.md)."""
    out: list[nn.Module] = []
    c, h, w = shape
    flat = None  # the vector width once flattened
    for token in spec.split(","):
        if m := re.fullmatch(r"conv(\d+)(?:k(\d+))?([sv])?", token):
            k, same = int(m[2] or 3), m[3] == "s"
            out.append(nn.Conv2d(c, int(m[1]), k, padding=(k - 1) // 2 if same else 0))
            c, h, w = int(m[1]), (h if same else h - k + 1), (w if same else w - k + 1)
        elif token == "bn":
            out.append(nn.BatchNorm2d(c) if flat is None else nn.BatchNorm1d(flat))
        elif token == "relu":
            out.append(nn.ReLU())
        elif token == "gap":
            out += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
            flat = c
        elif token in ("pool", "avgpool"):
            out.append(nn.MaxPool2d(2) if token == "pool" else nn.AvgPool2d(2))
            h, w = h // 2, w // 2
        elif m := re.fullmatch(r"(flatten|dense)(\d*)", token):
            if flat is None:
                out.append(nn.Flatten())
                flat = c * h * w
            if m[1] == "dense":
                width = int(m[2]) if m[2] else classes
                out.append(nn.Linear(flat, width))
                flat = width
        else:
            raise ValueError(f"this bench does not know the layer {token!r}")
    return nn.Sequential(*out)


# ---------------------------------------------------- augmentation, steps


def augmented(images: np.ndarray, pad: int, flip: bool, rng: np.random.Generator) -> np.ndarray:
    """A random crop of each zero-padded image (shift in [-pad, pad]) and,
    with probability 1/2 each, its mirror image; uint8 (N, C, H, W)."""
    n, c, h, w = images.shape
    if pad:
        padded = np.zeros((n, c, h + 2 * pad, w + 2 * pad), np.uint8)
        padded[:, :, pad:pad + h, pad:pad + w] = images
        dy, dx = rng.integers(0, 2 * pad + 1, (2, n))
        images = np.stack([padded[i, :, dy[i]:dy[i] + h, dx[i]:dx[i] + w] for i in range(n)])
    if flip:
        mirror = rng.random(n) < 0.5
        images = np.where(mirror[:, None, None, None], images[..., ::-1], images)
    return images


def inputs(images: np.ndarray) -> torch.Tensor:
    return (torch.from_numpy(np.ascontiguousarray(images)).float().div_(255) - MEAN) / STD


def lr_lambda(warmup: int, planned: int, decay: str):
    """The recipe's step-size factor at update k (docs/algorithms.md)."""
    def factor(k: int) -> float:
        if k < warmup:
            return (k + 1) / warmup
        x = min((k - warmup) / max(planned - warmup, 1), 1.0)
        return {"none": 1.0, "cosine": 0.5 * (1 + math.cos(math.pi * x)),
                "linear": 1 - x}[decay]
    return factor


class Trainer:
    """One optimiser (and step-size schedule) over the whole run, as a
    PyTorch user writes it; its updates count as first, first + stride, ...
    in the schedule (a Hogwild! process's share of the run's updates)."""

    def __init__(self, net, r: dict, first: int = 0, stride: int = 1):
        self.net, self.r = net, r
        self.opt = torch.optim.SGD(net.parameters(), lr=r["lr"], momentum=r["momentum"],
                                   nesterov=r["nesterov"], weight_decay=r["weight_decay"])
        factor = lr_lambda(r["warmup"], r["planned"], r["lr_decay"])
        self.schedule = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda k: factor(first + stride * k))

    def epoch(self, data, indices: np.ndarray, rng: np.random.Generator) -> None:
        """One pass over `indices` in batches."""
        r, b = self.r, self.r["batch_size"]
        self.net.train()
        for start in range(0, indices.size, b):
            idx = indices[start:start + b]
            x = inputs(augmented(data.x_train[idx], r["pad"], r["flip"], rng))
            loss = F.cross_entropy(self.net(x), torch.from_numpy(data.y_train[idx]),
                                   label_smoothing=r["label_smoothing"])
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            self.schedule.step()


def accuracy(net, data) -> float:
    net.eval()
    right = 0
    with torch.no_grad():
        for start in range(0, data.x_test.shape[0], 1000):
            x = inputs(data.x_test[start:start + 1000])
            right += int((net(x).argmax(1).numpy() == data.y_test[start:start + 1000]).sum())
    return right / data.x_test.shape[0]


def epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(n)


def _process(rank, net, data, r, seed, barrier, stop):
    """A Hogwild! process: its half of every epoch, then waits while the
    parent evaluates."""
    torch.set_num_threads(1)
    trainer = Trainer(net, r, first=rank, stride=2)
    rng = np.random.default_rng([seed, rank])
    for epoch in range(r["epochs"]):
        trainer.epoch(data, epoch_order(seed, epoch, data.x_train.shape[0])[rank::2], rng)
        barrier.wait()  # the epoch is done
        barrier.wait()  # the parent has evaluated
        if stop.value:
            return


def torch_arm(arm: str, data, r: dict, target: float, cap_s: float, seed: int) -> dict:
    """One PyTorch arm until the target or cap_s of training; its curve."""
    torch.manual_seed(seed)
    net = torch_layers(r["spec"], data.x_train.shape[1:], data.num_classes)
    threads = 1 if arm == "1-thread" else 2
    times, accs, trained = [], [], 0.0
    if arm == "2-processes":
        net.share_memory()
        ctx = mp.get_context("fork")
        barrier, stop = ctx.Barrier(3), ctx.Value("i", 0)
        procs = [ctx.Process(target=_process, args=(k, net, data, r, seed, barrier, stop))
                 for k in range(2)]
        for p in procs:
            p.start()
    else:
        trainer, rng = Trainer(net, r), np.random.default_rng([seed, 0])
    for epoch in range(r["epochs"]):
        torch.set_num_threads(threads)
        t0 = time.perf_counter()
        if arm == "2-processes":
            barrier.wait()
        else:
            trainer.epoch(data, epoch_order(seed, epoch, data.x_train.shape[0]), rng)
        trained += time.perf_counter() - t0
        torch.set_num_threads(2)  # evaluation, outside the clock
        times.append(trained)
        accs.append(accuracy(net, data))
        print(f"  torch {arm}: epoch {epoch + 1} {accs[-1]:.2%} at {trained:.0f} s", flush=True)
        done = accs[-1] >= target or trained > cap_s or epoch + 1 == r["epochs"]
        if arm == "2-processes":
            stop.value = int(done)
            barrier.wait()  # the processes go on (or end) from here
        if done:
            break
    if arm == "2-processes":
        for p in procs:
            p.join()
    return {"arm": arm, "time_s": times, "accuracy": accs,
            "to_target_s": time_to_target(times, accs, target)}


# ------------------------------------------------------------------- iasgd


def iasgd_arm(args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        cmd = [sys.executable, "-m", "iasgd.run", "--recipe", args.recipe, "--algo", args.algo,
               "--threads", str(args.threads), "--seed", str(args.seed), "--out", str(out),
               "--no-checkpoint", "--quiet"]
        if args.archive:
            cmd += ["--archive", args.archive]
        subprocess.run(cmd, check=True)
        doc = json.loads(out.read_text())
    times = [e["wall_s"] for e in doc["epochs"]]
    accs = [e["test_accuracy"] for e in doc["epochs"]]
    return {"arm": f"iasgd {args.algo} x {args.threads}", "time_s": times, "accuracy": accs,
            "to_target_s": time_to_target(times, accs, args.target), "command": " ".join(cmd)}


def recipe_settings(name: str, dataset) -> dict:
    """The recipe as this bench needs it (iasgd's defaults where it is silent)."""
    from iasgd.config import TrainConfig

    s = {**{f: getattr(TrainConfig(), f) for f in (
        "batch_size", "lr", "momentum", "nesterov", "weight_decay", "label_smoothing",
        "lr_warmup", "lr_decay", "epochs", "augment", "crop_padding")}, **RECIPES[name].settings}
    spec = models.build(s["model"], dataset.name).spec
    planned = s["epochs"] * math.ceil(dataset.x_train.shape[0] / s["batch_size"])
    return {**s, "spec": spec, "planned": planned, "warmup": round(s["lr_warmup"] * planned),
            "pad": s["crop_padding"] if "crop" in s["augment"] else 0,
            "flip": "flip" in s["augment"]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", default="cifar10", choices=sorted(RECIPES))
    p.add_argument("--target", type=float, default=0.80)
    p.add_argument("--archive", default=None)
    p.add_argument("--algo", default="interval")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arms", nargs="+", default=["1-thread", "2-threads", "2-processes"],
                   choices=["1-thread", "2-threads", "2-processes"])
    p.add_argument("--cap", type=float, default=2.0,
                   help="stop a PyTorch arm after this many times iasgd's time to the target")
    p.add_argument("--out", default=str(RESULTS / "recipe-vs-torch.json"))
    args = p.parse_args(argv)
    ours = iasgd_arm(args)
    print(f"{ours['arm']}: {ours['to_target_s']} s to {args.target:.0%}", flush=True)
    data = datasets.load(RECIPES[args.recipe].settings["dataset"], archive=args.archive)
    r = recipe_settings(args.recipe, data)
    mine = ours["to_target_s"] or max(ours["time_s"])
    arms = [torch_arm(arm, data, r, args.target, args.cap * mine, args.seed) for arm in args.arms]
    print(f"\ntime to {args.target:.0%} test accuracy ({r['spec']}, b={r['batch_size']}, "
          f"{r['epochs']} epochs planned; torch {torch.__version__})")
    print("| run | time to target | best accuracy | iasgd / this |\n|---|---:|---:|---:|")
    for arm in [ours, *arms]:
        t = arm["to_target_s"]
        shown = f"{t:.0f} s" if t is not None else f"not by {max(arm['time_s']):.0f} s"
        bound = t if t is not None else max(arm["time_s"])
        ratio = ("" if arm is ours or ours["to_target_s"] is None
                 else f"{ours['to_target_s'] / bound:.2f}" + ("" if t is not None else " or less"))
        print(f"| {arm['arm']} | {shown} | {max(arm['accuracy']):.2%} | {ratio} |")
    Path(args.out).write_text(json.dumps({"recipe": r, "target": args.target, "iasgd": ours,
                                          "torch": arms, "torch_version": torch.__version__},
                                         indent=1, default=str))


if __name__ == "__main__":
    main()
