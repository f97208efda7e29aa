"""The models: their parameter layout, workspace layout, initialisation and API.

This is the one place that computes where every tensor lives: in the flat
float32 parameter array (`Model.layout`) and in a worker's flat activation
workspace (the plan tables that `iasgd.kernels` reads).

A model is a stack of conv blocks (5x5 valid conv -> ReLU -> 2x2 max-pool)
followed by dense layers (ReLU between them, none after the logits):

- lenet, CIFAR-10 (3x32x32):  conv 3->6, conv 6->16, dense 400->120->10  (52,202)
- lenet, CIFAR-100:           same convs, dense 400->120->84->100        (69,656)
- lenet, Fashion-MNIST (1x28x28): conv 1->6, conv 6->16, dense 256->120->10 (34,622)
- mlp: dense layers only, hidden widths configurable (default 128,128,128).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from iasgd import kernels as K
from iasgd.datasets import DATASETS

MODELS = ("lenet", "mlp")
DEFAULT_HIDDEN = (128, 128, 128)

# input shape (C, H, W) and class count of each dataset, from its declaration
DATASET_SHAPES: dict[str, tuple[tuple[int, int, int], int]] = {
    name: (spec.input_shape, spec.num_classes) for name, spec in DATASETS.items()}

# Inputs in [0, 1] enter the network as (x - 0.5) / 0.5, in [-1, 1], like
# PyTorch's CIFAR recipe Normalize((0.5,) * C, (0.5,) * C). Centred inputs get
# LeNet-5 off its initial plateau sooner (measured on CIFAR-10, 3 epochs:
# 47.0-48.2 % with raw [0, 1] inputs, 52.5-53.2 % centred).
INPUT_MEAN = 0.5
INPUT_STD = 0.5

LENET_CHANNELS = (6, 16)
LENET_HIDDEN = {10: (120,), 100: (120, 84)}  # by class count, as in the paper


@dataclass(frozen=True)
class Architecture:
    """Layer sizes: conv output channels, then dense hidden widths."""

    input_shape: tuple[int, int, int]
    conv_channels: tuple[int, ...]
    hidden: tuple[int, ...]
    num_classes: int


def lenet(input_shape: tuple[int, int, int], num_classes: int) -> Architecture:
    """LeNet-5 as in the paper (two conv blocks, dense head by class count)."""
    hidden = LENET_HIDDEN.get(num_classes, (120, 84))
    return Architecture(tuple(input_shape), LENET_CHANNELS, hidden, num_classes)


def mlp(input_shape: tuple[int, int, int], num_classes: int,
        hidden: tuple[int, ...] = DEFAULT_HIDDEN) -> Architecture:
    """Dense layers with ReLU on the flattened input."""
    return Architecture(tuple(input_shape), (), tuple(hidden), num_classes)


def conv_output_shape(c: int, h: int, w: int, cout: int) -> tuple[int, int, int]:
    """Shape after one conv block: 5x5 valid conv then floor 2x2 pool."""
    return cout, (h - K.KSIZE + 1) // 2, (w - K.KSIZE + 1) // 2


def _check_architecture(arch: Architecture) -> None:
    c, h, w = arch.input_shape
    for cout in arch.conv_channels:
        if h < K.KSIZE + 1 or w < K.KSIZE + 1:
            raise ValueError(f"input {arch.input_shape} is too small for "
                             f"{len(arch.conv_channels)} conv blocks")
        c, h, w = conv_output_shape(c, h, w, cout)
    if arch.num_classes < 2:
        raise ValueError(f"need at least 2 classes, got {arch.num_classes}")
    if any(width < 1 for width in arch.hidden):
        raise ValueError(f"hidden widths must be positive, got {arch.hidden}")


def parameter_layout(arch: Architecture) -> list[tuple[str, tuple[int, ...], int]]:
    """(name, shape, offset) of every tensor in the flat parameter array."""
    layout: list[tuple[str, tuple[int, ...], int]] = []
    offset = 0

    def add(name: str, shape: tuple[int, ...]) -> None:
        nonlocal offset
        layout.append((name, shape, offset))
        offset += math.prod(shape)

    c, h, w = arch.input_shape
    for i, cout in enumerate(arch.conv_channels, start=1):
        add(f"conv{i}.weight", (cout, c, K.KSIZE, K.KSIZE))
        add(f"conv{i}.bias", (cout,))
        c, h, w = conv_output_shape(c, h, w, cout)
    width = c * h * w
    for i, out in enumerate((*arch.hidden, arch.num_classes), start=1):
        add(f"fc{i}.weight", (out, width))
        add(f"fc{i}.bias", (out,))
        width = out
    return layout


@dataclass(frozen=True)
class Plan:
    """Offsets of every activation for a batch capacity, as kernel tables.

    conv: (n_conv, CONV_COLUMNS) int64; dense: (n_dense, DENSE_COLUMNS) int64;
    acts_size / argmax_size: float32 / int32 workspace lengths.
    """

    conv: np.ndarray
    dense: np.ndarray
    acts_size: int
    argmax_size: int


def activation_plan(arch: Architecture, layout: list, capacity: int) -> Plan:
    """Lay out the activations of `capacity` samples in one flat workspace.

    The input occupies acts[: capacity * C*H*W]; each layer's outputs follow.
    """
    offsets = {name: off for name, _, off in layout}
    c, h, w = arch.input_shape
    acts = capacity * c * h * w
    x_off, argmax = 0, 0
    conv_rows = []
    for i, cout in enumerate(arch.conv_channels, start=1):
        oh = h - K.KSIZE + 1
        _, ph, pw = conv_output_shape(c, h, w, cout)
        z_off = acts
        acts += capacity * cout * oh * w  # wide rows, see kernels
        p_off = acts
        acts += capacity * cout * ph * pw
        conv_rows.append((c, cout, h, w, offsets[f"conv{i}.weight"], offsets[f"conv{i}.bias"],
                          x_off, z_off, p_off, argmax))
        argmax += capacity * cout * ph * pw
        x_off, (c, h, w) = p_off, (cout, ph, pw)
    width = c * h * w
    widths = (*arch.hidden, arch.num_classes)
    dense_rows = []
    for i, out in enumerate(widths, start=1):
        z_off = acts
        acts += capacity * out
        relu = int(i < len(widths))
        dense_rows.append((width, out, offsets[f"fc{i}.weight"], offsets[f"fc{i}.bias"],
                           x_off, z_off, relu))
        x_off, width = z_off, out
    conv = np.array(conv_rows, dtype=np.int64).reshape(-1, K.CONV_COLUMNS)
    dense = np.array(dense_rows, dtype=np.int64).reshape(-1, K.DENSE_COLUMNS)
    return Plan(conv, dense, acts, max(argmax, 1))


class Workspace:
    """A worker's preallocated buffers for batches of up to `capacity` samples:
    activations, their gradients, pooling indices, the parameter gradient and
    the batch's labels. Nothing on the step path allocates."""

    def __init__(self, plan: Plan, num_params: int, capacity: int, *, backward: bool = True):
        self.plan = plan
        self.capacity = capacity
        self.acts = np.zeros(plan.acts_size, np.float32)
        self.dacts = np.zeros(plan.acts_size if backward else 1, np.float32)
        self.argmax = np.zeros(plan.argmax_size, np.int32)
        self.grad = np.zeros(num_params if backward else 1, np.float32)
        self.labels = np.zeros(capacity, np.int64)


class Model:
    """A network on one flat float32 parameter array.

    `layout` lists (name, shape, offset) of each tensor; shapes follow PyTorch
    (conv (out, in, kh, kw), dense (out, in), flatten in C order of (C, H, W)).
    """

    def __init__(self, name: str, arch: Architecture):
        _check_architecture(arch)
        self.name = name
        self.arch = arch
        self.layout = parameter_layout(arch)
        _, last_shape, last_off = self.layout[-1]
        self.num_params = last_off + math.prod(last_shape)
        self._eval_ws: Workspace | None = None

    @property
    def image_transform(self) -> tuple[float, float]:
        """(scale, shift) taking uint8 pixels to network inputs."""
        return 1.0 / (255.0 * INPUT_STD), -INPUT_MEAN / INPUT_STD

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return self.arch.input_shape

    @property
    def input_size(self) -> int:
        return math.prod(self.arch.input_shape)

    @property
    def num_classes(self) -> int:
        return self.arch.num_classes

    def tensors(self, params: np.ndarray) -> dict[str, np.ndarray]:
        """Named views (not copies) of the tensors inside a flat array."""
        return {name: params[off:off + math.prod(shape)].reshape(shape)
                for name, shape, off in self.layout}

    def init(self, seed: int) -> np.ndarray:
        """Seeded PyTorch-default initialisation, flat float32.

        Weights and biases ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), which is what
        torch.nn.Conv2d/Linear do (Kaiming-uniform with a = sqrt(5)). The paper's
        N(0, 0.01) leaves LeNet-5 stuck at loss ln(10) for epochs.
        """
        rng = np.random.default_rng(seed)
        params = np.empty(self.num_params, np.float32)
        fan_in = 1
        for name, shape, off in self.layout:
            if name.endswith(".weight"):
                fan_in = math.prod(shape[1:])
            bound = 1.0 / math.sqrt(fan_in)
            size = math.prod(shape)
            params[off:off + size] = rng.uniform(-bound, bound, size)
        return params

    def workspace(self, capacity: int, *, backward: bool = True) -> Workspace:
        """Fresh buffers for batches of up to `capacity` samples."""
        if capacity < 1:
            raise ValueError(f"batch capacity must be >= 1, got {capacity}")
        plan = activation_plan(self.arch, self.layout, capacity)
        return Workspace(plan, self.num_params, capacity, backward=backward)

    # ---- convenience API (allocates; the training path uses the kernels directly)

    def loss_and_grad(self, params: np.ndarray, x: np.ndarray,
                      y: np.ndarray) -> tuple[float, np.ndarray]:
        """Batch-mean softmax cross-entropy and its flat gradient.

        params: (num_params,) float32; x: float32 (N, C, H, W) (or (N, D) for an
        MLP) in [0, 1]; y: (N,) int labels.
        """
        params = self._check_params(params)
        x2 = self._flat_inputs(x)
        labels = np.asarray(y, dtype=np.int64)
        if labels.shape != (x2.shape[0],):
            raise ValueError(f"labels must have shape ({x2.shape[0]},), got {labels.shape}")
        if labels.size and (labels.min() < 0 or labels.max() >= self.num_classes):
            raise ValueError(f"labels must lie in [0, {self.num_classes})")
        ws = self.workspace(max(x2.shape[0], 1))
        self._load_inputs(x2, ws)
        loss = K.network_loss_and_grad(params, ws.grad, ws.plan.conv, ws.plan.dense,
                                       ws.acts, ws.dacts, ws.argmax, labels)
        return float(loss), ws.grad

    def logits(self, params: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Raw scores (N, num_classes) for float32 inputs in [0, 1]."""
        params = self._check_params(params)
        x2 = self._flat_inputs(x)
        n = x2.shape[0]
        ws = self.workspace(max(n, 1), backward=False)
        self._load_inputs(x2, ws)
        K.network_forward(params, ws.plan.conv, ws.plan.dense, ws.acts, ws.argmax, n)
        last = ws.plan.dense[-1]
        off, width = last[K.D_ZOFF], last[K.D_OUT]
        return ws.acts[off:off + n * width].reshape(n, width).copy()

    def predict(self, params: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Predicted labels (N,) int64 for float32 inputs in [0, 1]."""
        return np.argmax(self.logits(params, x), axis=1)

    def predict_images(self, params: np.ndarray, images: np.ndarray,
                       batch: int = 500) -> np.ndarray:
        """Predicted labels for uint8 images (M, C, H, W), compiled and batched."""
        if self._eval_ws is None or self._eval_ws.capacity != batch:
            self._eval_ws = self.workspace(batch, backward=False)
        ws = self._eval_ws
        out = np.empty(images.shape[0], np.int64)
        K.predict_images(params, ws.plan.conv, ws.plan.dense, ws.acts, ws.argmax,
                         ws.capacity, images.reshape(images.shape[0], -1),
                         *self.image_transform, out)
        return out

    def _load_inputs(self, x2: np.ndarray, ws: Workspace) -> None:
        """Put (N, D) inputs in [0, 1] into the workspace as network inputs."""
        K.affine_copy(x2, 1.0 / INPUT_STD, -INPUT_MEAN / INPUT_STD, ws.acts[:x2.size])

    def _check_params(self, params: np.ndarray) -> np.ndarray:
        if params.shape != (self.num_params,) or params.dtype != np.float32:
            raise ValueError(f"params must be float32 of shape ({self.num_params},), "
                             f"got {params.dtype} {params.shape}")
        return params

    def _flat_inputs(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim < 2 or math.prod(x.shape[1:]) != self.input_size:
            raise ValueError(f"inputs must be (N, {', '.join(map(str, self.input_shape))}) "
                             f"or (N, {self.input_size}), got {x.shape}")
        return x.reshape(x.shape[0], self.input_size)


def build(name: str, dataset: str | None = "cifar10", *,
          input_shape: tuple[int, int, int] | None = None,
          num_classes: int | None = None,
          hidden: tuple[int, ...] | None = None) -> Model:
    """The model `name` ("lenet" or "mlp") sized for `dataset`.

    input_shape / num_classes override the dataset's (for tests and new data);
    hidden sets the MLP's widths (default 128,128,128).
    """
    if dataset is not None and dataset not in DATASET_SHAPES:
        raise ValueError(f"unknown dataset {dataset!r}; choose from {', '.join(DATASET_SHAPES)}")
    base_shape, base_classes = DATASET_SHAPES[dataset] if dataset else (None, None)
    shape = input_shape or base_shape
    classes = num_classes or base_classes
    if shape is None or classes is None:
        raise ValueError("give a dataset or both input_shape and num_classes")
    shape = tuple(shape)
    if name == "lenet":
        if hidden is not None:
            raise ValueError("--hidden applies to the mlp model only")
        return Model(name, lenet(shape, classes))
    if name == "mlp":
        return Model(name, mlp(shape, classes, tuple(hidden or DEFAULT_HIDDEN)))
    raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
