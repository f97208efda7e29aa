"""The same networks in PyTorch, built from an iasgd model's layer list, for the
benchmarks and for cross-checking the kernels (tests skip it without torch)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from iasgd.nn.models import INPUT_MEAN, INPUT_STD, Conv, Dense, Flatten, Model, Pool, ReLU


class TorchNet(nn.Module):
    """The model's layers as torch modules, with parameters named like iasgd's
    layout (conv1, conv2, ..., fc1, fc2, ...) so that they can be copied over."""

    def __init__(self, model: Model):
        super().__init__()
        self.order: list[str] = []  # module names (or "relu", "pool", "flatten") in order
        for ls in model.shapes:
            layer = ls.layer
            if isinstance(layer, Conv):
                cin = model.layout_shape(f"{ls.name}.weight")[1]
                setattr(self, ls.name, nn.Conv2d(cin, layer.out, layer.k,
                                                 padding=(layer.k - 1) // 2
                                                 if layer.padding == "same" else 0))
                self.order.append(ls.name)
            elif isinstance(layer, Dense):
                out, inp = model.layout_shape(f"{ls.name}.weight")
                setattr(self, ls.name, nn.Linear(inp, out))
                self.order += ["flatten", ls.name]
            elif isinstance(layer, ReLU | Pool | Flatten):
                self.order.append(ls.name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name in self.order:
            if name == "relu":
                x = torch.relu(x)
            elif name == "pool":
                x = torch.nn.functional.max_pool2d(x, 2)
            elif name == "flatten":
                x = x.flatten(1)
            else:
                x = getattr(self, name)(x)
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
    """The parameters in iasgd's layout order (conv1.weight, conv1.bias, ...)."""
    return np.concatenate([p.detach().numpy().ravel() for p in net.parameters()])
