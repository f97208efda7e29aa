"""iasgd.torch with real nn.Modules and torch.optim under worker processes:
a conv + batch norm + linear network keeps the bound with every update
counted, and a linear model with a known gradient ends at exactly the sum
of the updates applied."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
it = pytest.importorskip("iasgd.torch")

from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from iasgd.protocol import gate as G  # noqa: E402

PROCESSES = 4
STEPS = 50  # of each process, on the linear model


class SmallNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.norm = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 6 * 6, 3)

    def forward(self, x):
        return self.fc(torch.relu(self.norm(self.conv(x))).flatten(1))


def train_worker(rank, model, gate, counts, taus):
    """Steps on batches of its own until the gate stops it; counts the
    updates it applied and the largest tau it was told."""
    g = torch.Generator().manual_seed(rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    while True:
        x = torch.randn(8, 1, 8, 8, generator=g)
        target = torch.randint(0, 3, (8,), generator=g)
        with gate.step() as step:
            loss = F.cross_entropy(model(x), target)
            opt.zero_grad()
            loss.backward()
            if step.apply(opt.step, scale_lr=opt, loss=loss):
                counts[rank] += 1
                taus[rank] = max(int(taus[rank]), step.tau)


@pytest.mark.parametrize(("y", "policy"), [(4, "wait"), (3, "drop")])
def test_a_conv_batchnorm_linear_net_keeps_the_bound_with_every_update_counted(y, policy):
    torch.manual_seed(0)
    model = SmallNet()
    model.share_memory()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    counts = torch.zeros(PROCESSES, dtype=torch.int64).share_memory_()
    taus = torch.zeros(PROCESSES, dtype=torch.int64).share_memory_()
    updates = 240
    gate = it.IntervalGate(y, policy=policy, workers=PROCESSES, max_updates=updates,
                           lr_schedule="inverse")
    report = gate.run(train_worker, args=(model, gate, counts, taus), processes=PROCESSES,
                      start_method="fork")
    assert report.status == "completed"
    assert counts.sum().item() == report.applied == updates == int(gate.state[G.VERSION])
    assert report.staleness_hist.sum() == updates
    assert report.bound_violations == 0
    assert taus.max().item() == report.staleness_max <= report.staleness_bound == y - 1
    assert report.intervals == updates // y
    assert report.computed == report.applied + report.dropped
    assert (policy == "wait") == (report.dropped == 0)
    assert report.left == 0 and report.workers == PROCESSES
    after = dict(model.named_parameters())
    for name in ("conv.weight", "norm.weight", "norm.bias", "fc.weight", "fc.bias"):
        assert not torch.equal(before[name], after[name]), name  # (conv.bias: BN cancels it)
    assert all(torch.isfinite(p).all() for p in model.parameters())


def known_gradient_worker(rank, model, gate, steps):
    """loss = model(x).sum() with x = rank + 1 everywhere: the gradient is
    rank + 1 for every weight and 1 for the bias, whatever the parameters,
    and SGD at lr 1 subtracts exactly that, `steps` times."""
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    x = torch.full((1, 6), float(rank + 1))
    for _ in range(steps):
        with gate.step() as step:
            opt.zero_grad()
            model(x).sum().backward()
            step.apply(opt.step)


@pytest.mark.parametrize("make", [lambda: it.IntervalGate(1, workers=PROCESSES),
                                  lambda: it.AsyncGate(workers=PROCESSES)],
                         ids=["interval-y1", "async"])
def test_a_linear_model_ends_at_the_sum_of_the_applied_updates(make):
    """Writes that no two processes make at once (y = 1; async's lock)
    lose nothing: the parameters are exactly minus the sum of the updates
    every process applied."""
    model = nn.Linear(6, 1)
    with torch.no_grad():
        model.weight.zero_()
        model.bias.zero_()
    model.share_memory()
    gate = make()
    report = gate.run(known_gradient_worker, args=(model, gate, STEPS), processes=PROCESSES,
                      start_method="fork")
    assert report.status == "completed" and report.bound_violations == 0
    assert report.applied == PROCESSES * STEPS == int(gate.state[G.VERSION])
    expected = -float(STEPS * sum(rank + 1 for rank in range(PROCESSES)))
    assert torch.equal(model.weight.detach(), torch.full((1, 6), expected))
    assert model.bias.item() == -PROCESSES * STEPS
