"""The same networks in PyTorch, built from an iasgd model's layer kinds
(iasgd.export.torch_module), for the benchmarks and for cross-checking the
kernels (tests skip it without torch)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from iasgd.export import torch_module
from iasgd.nn.models import INPUT_MEAN, INPUT_STD, Model


def torch_net(model: Model, params: np.ndarray) -> nn.Sequential:
    """The model as torch modules (parameters named like iasgd's layout:
    conv1, ..., fc1, ...) holding a copy of the flat iasgd parameters."""
    net = torch_module(model)
    tensors = model.tensors(params)
    with torch.no_grad():
        for name, p in [*net.named_parameters(), *net.named_buffers()]:  # buffers: batch norm's
            if name in tensors:  # not its batch count
                p.copy_(torch.from_numpy(tensors[name]))
    return net


def torch_inputs(images: np.ndarray) -> torch.Tensor:
    """uint8 images (N, C, H, W) -> float32 network inputs, as iasgd transforms them."""
    x = torch.from_numpy(images).float().div_(255)
    return x.sub_(INPUT_MEAN).div_(INPUT_STD)


def torch_flat_params(net: nn.Module) -> np.ndarray:
    """The parameters in iasgd's layout order (conv1.weight, conv1.bias, ...,
    then batch norm's running statistics)."""
    return np.concatenate([p.detach().numpy().ravel()
                           for p in [*net.parameters(), *net.buffers()] if p.is_floating_point()])
