"""gate.run refuses, before any worker starts, what its workers would train
a private copy of (iasgd.torch.launch.unshared_argument): a model whose
share_memory() was forgotten, an optimiser over such parameters, a tensor
that requires grad outside shared memory; and a shared model does train."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
it = pytest.importorskip("iasgd.torch")

from iasgd.torch import launch  # noqa: E402


def sgd_worker(rank, model, gate, steps=8):
    """`steps` SGD steps on a fixed batch: the parameters move."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, target = torch.ones(4, 3), torch.zeros(4, dtype=torch.long)
    for _ in range(steps):
        with gate.step() as step:
            loss = torch.nn.functional.cross_entropy(model(x), target)
            opt.zero_grad()
            loss.backward()
            step.apply(opt.step)


def marking_worker(rank, marker, *_):
    marker.write_text("a worker ran")  # pragma: no cover - must never run


def refused(args, tmp_path) -> str:
    """run's error for `args` after a marker as first argument, checking
    that no worker ran and no ticket was taken."""
    gate = it.IntervalGate(y=2, workers=2)
    marker = tmp_path / "ran"
    with pytest.raises(ValueError) as error:
        gate.run(marking_worker, args=(marker, *args), processes=2)
    assert not marker.exists()
    assert gate.report().applied == 0
    message = str(error.value)
    assert "\n" not in message
    return message


def test_an_unshared_model_is_refused_with_what_to_do(tmp_path):
    model = torch.nn.Linear(3, 2)
    message = refused((model,), tmp_path)
    assert message.startswith("args[1] (Linear): its parameters are not in shared memory")
    assert "call model.share_memory() before gate.run" in message


def test_a_model_whose_buffers_alone_are_unshared_is_refused(tmp_path):
    model = torch.nn.BatchNorm1d(3).share_memory()
    model.running_mean = torch.zeros(3)  # replaced after sharing: a private buffer
    assert "(BatchNorm1d): its parameters are not in shared memory" in refused((model,),
                                                                                tmp_path)


def test_an_optimiser_over_unshared_parameters_is_refused(tmp_path):
    model = torch.nn.Linear(3, 2).share_memory()
    elsewhere = copy.deepcopy(model)  # a deep copy's storage is private again
    opt = torch.optim.SGD(elsewhere.parameters(), lr=0.1)
    message = refused((model, opt), tmp_path)
    assert message.startswith("args[2] (SGD): the parameters it was built over are not in "
                              "shared memory")
    opt_on_shared = torch.optim.SGD(model.parameters(), lr=0.1)
    assert launch.unshared_argument((model, opt_on_shared)) is None


def test_a_tensor_that_requires_grad_is_checked_and_data_is_not(tmp_path):
    weights = torch.zeros(5, requires_grad=True)
    assert "args[1] (Tensor): it is not in shared memory" in refused((weights,), tmp_path)
    data = torch.zeros(5)  # read only by the workers: a copy is what they need
    assert launch.unshared_argument((data, weights.detach().share_memory_().requires_grad_()),
                                    ) is None


def test_models_inside_lists_and_dicts_are_found(tmp_path):
    shared, private = torch.nn.Linear(3, 2).share_memory(), torch.nn.Linear(3, 2)
    assert refused(([shared, private],), tmp_path).startswith("args[1][1] (Linear)")
    assert refused(({"model": private},), tmp_path).startswith("args[1]['model'] (Linear)")


def test_a_shared_model_comes_back_trained():
    """The positive side: the documented pattern passes the check and the
    parent's parameters move (forked, where an unshared model's would not;
    spawned runs pass the same check, and leave torch's shared-memory
    cache to print errors at the interpreter's exit)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).share_memory()
    before = copy.deepcopy(model.state_dict())
    gate = it.IntervalGate(y=2, workers=2)
    report = gate.run(sgd_worker, args=(model, gate), processes=2, start_method="fork")
    assert report.applied == 16
    assert not torch.equal(model.weight, before["weight"])
