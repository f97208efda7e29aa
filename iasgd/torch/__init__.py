"""Interval-Asynchrony for any PyTorch model: the gate of iasgd.protocol,
shared by the worker processes of PyTorch's own Hogwild! loop
(`model.share_memory()`, `torch.multiprocessing`), so every update's
staleness is at most y - 1 (docs/pytorch.md).

    import iasgd.torch as it
    gate = it.IntervalGate(y=16)

    def worker(rank, model, gate):
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        for x, target in loader:
            with gate.step() as step:        # ticket and slot taken; V read
                loss = F.cross_entropy(model(x), target)
                opt.zero_grad(); loss.backward()
                step.apply(opt.step)         # commit, write, close; step.tau known

    report = gate.run(worker, args=(model, gate), processes=4)

Needs PyTorch; its CPU build is enough, and PyPI's plain `torch` is the CUDA
build (several GB), so: pip install torch --index-url
https://download.pytorch.org/whl/cpu && pip install -e '.[torch]'
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError as err:  # pragma: no cover - depends on the environment
    from iasgd.export import INSTALL

    raise ImportError(f"iasgd.torch needs PyTorch, its CPU build: {INSTALL['torch']}") from err

from iasgd.torch.gate import (
    AsyncGate,
    Gate,
    GateReport,
    HogwildGate,
    IntervalGate,
    Step,
    Stopped,
)
from iasgd.torch.launch import Interrupted, WorkerError, run

__all__ = ["AsyncGate", "Gate", "GateReport", "HogwildGate", "Interrupted", "IntervalGate",
           "Step", "Stopped", "WorkerError", "run"]
