"""The same networks in PyTorch, built from an iasgd model's layout, for the
benchmarks and for cross-checking the kernels (tests skip it without torch)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from iasgd.models import INPUT_MEAN, INPUT_STD, Model


class TorchNet(nn.Module):
    """Conv blocks (5x5 conv, ReLU, 2x2 max-pool) then dense layers, named like
    iasgd's layout (conv1, conv2, ..., fc1, fc2, ...)."""

    def __init__(self, model: Model):
        super().__init__()
        arch = model.arch
        c = arch.input_shape[0]
        self.convs = len(arch.conv_channels)
        self.denses = len(arch.hidden) + 1
        for i, cout in enumerate(arch.conv_channels, start=1):
            setattr(self, f"conv{i}", nn.Conv2d(c, cout, 5))
            c = cout
        shapes = {name: shape for name, shape, _ in model.layout}
        for i in range(1, self.denses + 1):
            out, inp = shapes[f"fc{i}.weight"]
            setattr(self, f"fc{i}", nn.Linear(inp, out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(1, self.convs + 1):
            x = F.max_pool2d(F.relu(getattr(self, f"conv{i}")(x)), 2)
        x = x.flatten(1)
        for i in range(1, self.denses + 1):
            x = getattr(self, f"fc{i}")(x)
            if i < self.denses:
                x = F.relu(x)
        return x


def torch_net(model: Model, params: np.ndarray) -> TorchNet:
    """A TorchNet holding a copy of the flat iasgd parameters."""
    net = TorchNet(model)
    tensors = model.tensors(params)
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(torch.from_numpy(tensors[name]))
    return net


def torch_inputs(images: np.ndarray) -> torch.Tensor:
    """uint8 images (N, C, H, W) -> float32 network inputs, as iasgd transforms them."""
    x = torch.from_numpy(images).float().div_(255)
    return x.sub_(INPUT_MEAN).div_(INPUT_STD)


def torch_flat_params(net: TorchNet) -> np.ndarray:
    return np.concatenate([p.detach().numpy().ravel() for p in net.parameters()])
