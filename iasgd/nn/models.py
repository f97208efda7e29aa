"""The models: their layers, parameter layout, workspace plan, initialisation and API.

A model is a list of layers, the one description everything else is computed
from, here and only here: the parameter layout in the flat float32 array
(`Model.layout`) and the plan, one int64 table that the compiled network
passes loop over (`iasgd.nn.plan`, one row per op), with every activation's
offset in a worker's flat workspace.

Everything a layer kind knows is its record (iasgd.nn.layers): the driver
here only loops over the records. What it adds is the fusion step of the
lowering (a ReLU joins the row before or after it that computes it) and the
slice rule.

Layers (one kind each, iasgd.nn.layers): `Conv(out, k, padding)` (k odd,
stride 1, "valid" or "same"), `ReLU()`, `Pool()` (2x2 max, stride 2, floor),
`Flatten()`, `Dense(out)`, ...; the last layer is the dense output layer
(`Dense()` takes the dataset's class count). A dense layer after a spatial
map flattens it (C order, as PyTorch's `flatten(1)`). The compact spec string
(`--model`) is the same list, `docs/models.md` has its grammar. Presets:

- lenet, CIFAR-10 (3x32x32):  conv 3->6, conv 6->16, dense 400->120->10  (52,202)
- lenet, CIFAR-100:           same convs, dense 400->120->84->100        (69,656)
- lenet, Fashion-MNIST (1x28x28): conv 1->6, conv 6->16, dense 256->120->10 (34,622)
- mlp: dense layers only, hidden widths configurable (default 128,128,128).
- vgg-small, CIFAR-10: two 3x3 same conv blocks (32, 64 channels) with pooling,
  dense 4096->128->10 (545,098).
- vgg-bn, CIFAR-10: three 3x3 same conv blocks (32, 64, 128 channels), each
  with batch norm and pooling, dense 2048->10.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from iasgd.data.registry import DATASETS
from iasgd.nn import augment, layers, network, ops
from iasgd.nn.kinds import LayerShape, Lowering, Sizing
from iasgd.nn.layers import kind_of
from iasgd.nn.layers.conv import Conv
from iasgd.nn.layers.dense import Dense
from iasgd.nn.layers.flatten import Flatten
from iasgd.nn.layers.pool import Pool
from iasgd.nn.layers.relu import ReLU
from iasgd.nn.plan import P_CO, P_OP, P_RELU, P_ZOFF, Buffers

__all__ = ["Conv", "Dense", "Flatten", "LayerShape", "Pool", "ReLU"]  # the presets' kinds

MODELS = ("lenet", "mlp", "vgg-small", "vgg-bn")  # the presets; --model also takes a spec
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

LENET_HIDDEN = {10: (120,), 100: (120, 84)}  # by class count, as in the paper
# vgg-small: the smallest VGG-style net with two 3x3 "same" conv blocks. 32 and
# 64 channels are where a 3x3 conv has enough work per pixel for the wide-row
# kernels to run near their best, and two pools bring 32x32 down to 8x8 so the
# head (4096 -> 128) stays at 0.5 M parameters; a third block would shrink the
# head but add compute per sample without changing what is being studied (a
# conv net with 10x LeNet-5's compute and parameters).
VGG_SMALL = "conv32k3s,relu,pool,conv64k3s,relu,pool,dense128,relu,dense"
# vgg-bn: the CIFAR-10 recipe's net (iasgd.recipes): three 3x3 conv blocks of
# 32, 64 and 128 channels, each batch-normalised and pooled, and the logits
# straight from the 4x4 map: 1.7x vgg-small's compute per sample with a
# fifth of its parameters (bench/results/recipe-cifar10.md has the choice).
VGG_BN = ("conv32k3s,bn,relu,pool,conv64k3s,bn,relu,pool,conv128k3s,bn,relu,pool,dense")
SPEC_PRESETS = {"vgg-small": VGG_SMALL, "vgg-bn": VGG_BN}

Layer = Any  # an instance of a layer kind's dataclass (Conv, ReLU, ...)

_OUTPUTS = [kind.name for kind in layers.KINDS if kind.output]
SPEC_HELP = ("layers: " + ", ".join(kind.grammar for kind in layers.KINDS)
             + ", and last the output layer "
             + " or ".join(f"{name} or {name}<classes>" for name in _OUTPUTS))


# ------------------------------------------------------------------ layers


def parse_spec(spec: str) -> list[Layer]:
    """The layers of a spec string like "conv32k3s,relu,pool,dense128,relu,dense".

    Only the grammar is checked here; shapes are checked against a dataset by
    `build`. Raises ValueError naming the bad token.
    """
    out: list[Layer] = []
    for i, token in enumerate((t.strip() for t in spec.lower().split(",")), start=1):
        found = next(((kind, m) for kind in layers.KINDS
                      if (m := kind.pattern.fullmatch(token)) is not None), None)
        if found is None:
            raise ValueError(f"unknown layer {token!r} (layer {i}); {SPEC_HELP}")
        kind, m = found
        out.append(kind.parse(m))
    return out


def spec_string(layer_list: Sequence[Layer]) -> str:
    """The canonical spec string of a layer list (parse_spec's inverse)."""
    return ",".join(layer.spec() for layer in layer_list)


@dataclass(frozen=True)
class Architecture:
    """The layer list with the input shape and class count it is sized for."""

    input_shape: tuple[int, int, int]
    layers: tuple[Layer, ...]
    num_classes: int


def lenet(input_shape: tuple[int, int, int], num_classes: int) -> Architecture:
    """LeNet-5 as in the paper (two conv blocks, dense head by class count)."""
    hidden = LENET_HIDDEN.get(num_classes, (120, 84))
    layer_list: list[Layer] = [Conv(6, 5), ReLU(), Pool(), Conv(16, 5), ReLU(), Pool()]
    for width in hidden:
        layer_list += [Dense(width), ReLU()]
    return Architecture(tuple(input_shape), (*layer_list, Dense()), num_classes)


def mlp(input_shape: tuple[int, int, int], num_classes: int,
        hidden: tuple[int, ...] = DEFAULT_HIDDEN) -> Architecture:
    """Dense layers with ReLU on the flattened input."""
    layer_list: list[Layer] = []
    for width in hidden:
        layer_list += [Dense(width), ReLU()]
    return Architecture(tuple(input_shape), (*layer_list, Dense()), num_classes)


def layer_shapes(arch: Architecture) -> list[LayerShape]:
    """Check the layers against the input and give each one's output shape and
    parameters (named <prefix><count>.<tensor> by kind: conv1.weight, fc2.bias).
    Raises ValueError with one clear line for a net that does not fit."""
    if arch.num_classes < 2:
        raise ValueError(f"need at least 2 classes, got {arch.num_classes}")
    if not arch.layers:
        raise ValueError("a model needs at least its output layer (dense)")
    last = arch.layers[-1]
    if not kind_of(last).output:
        raise ValueError(f"the last layer must be the {' or '.join(_OUTPUTS)} output layer, "
                         f"got {last.spec()!r}")
    shape: tuple[int, ...] = tuple(arch.input_shape)
    out: list[LayerShape] = []
    counts: dict[str, int] = {}
    for i, layer in enumerate(arch.layers, start=1):
        kind = kind_of(layer)
        sizing = Sizing(f"{layer.spec()} (layer {i})", arch.num_classes, i == len(arch.layers))
        shape, params = kind.shape(layer, shape, sizing)
        name = kind.name
        if kind.prefix is not None:
            counts[kind.prefix] = counts.get(kind.prefix, 0) + 1
            name = f"{kind.prefix}{counts[kind.prefix]}"
        out.append(LayerShape(layer, name, shape,
                              tuple((f"{name}.{part}", s) for part, s in params)))
    return out


def parameter_layout(arch: Architecture) -> list[tuple[str, tuple[int, ...], int]]:
    """(name, shape, offset) of every tensor in the flat parameter array: the
    trained tensors in layer order, then the running statistics (Kind.statistics)."""
    tensors = [(name, shape, name.rsplit(".", 1)[1] in kind_of(ls.layer).statistics)
               for ls in layer_shapes(arch) for name, shape in ls.params]
    layout: list[tuple[str, tuple[int, ...], int]] = []
    offset = 0
    for name, shape, _ in sorted(tensors, key=lambda t: t[2]):  # stable: layer order kept
        layout.append((name, shape, offset))
        offset += math.prod(shape)
    return layout


def trained_size(arch: Architecture, layout: list) -> int:
    """How many of the flat parameters are trained (those before the first
    running statistic; all of them without one)."""
    statistics = {name for ls in layer_shapes(arch) for name, _ in ls.params
                  if name.rsplit(".", 1)[1] in kind_of(ls.layer).statistics}
    return next((off for name, _, off in layout if name in statistics),
                sum(math.prod(shape) for _, shape, _ in layout))


# ------------------------------------------------------------------ lowering


@dataclass(frozen=True)
class Lowered:
    """A model lowered for a batch capacity: its plan and the workspace it needs.

    table: the plan, (rows, PLAN_COLUMNS) int64 (iasgd.nn.plan);
    acts_size / argmax_size: float32 / int32 workspace lengths; slice_size:
    the samples that every activation but the input has room for (a batch
    runs through the network that many at a time).
    """

    table: np.ndarray
    acts_size: int
    argmax_size: int
    slice_size: int


# A batch runs through the network SLICE_SAMPLES samples at a time when its
# activations and their gradients overflow a core's L2 cache (L2_BYTES)
# while the parameters fit in half of it: a slice's activations then stay in
# L2, and the parameters and the partial gradient, read once more per slice,
# stay there too. With parameters larger than the cache the extra reads cost
# more than the slices save (measurements: bench/results/conv-paths.md, "Slices").
L2_BYTES = 1 << 20  # this machine's (AMD EPYC) and many current x86 cores'
SLICE_SAMPLES = 16


def slice_size(arch: Architecture, layout: list, num_params: int, capacity: int) -> int:
    """How many samples of a batch of up to `capacity` run through the
    network at a time: all of them or SLICE_SAMPLES (the rule above)."""
    if any(kind_of(layer).whole_batch for layer in arch.layers):
        return capacity
    one, two = (lower(arch, layout, n).acts_size for n in (1, 2))
    batch_bytes = 8 * (two - one) * capacity  # activations and their gradients
    if capacity > SLICE_SAMPLES and batch_bytes > L2_BYTES and 8 * num_params <= L2_BYTES:
        return SLICE_SAMPLES
    return capacity


def lower(arch: Architecture, layout: list, capacity: int,
          slice_size: int | None = None) -> Lowered:
    """Lower the layers to plan rows and lay out the activations of `capacity`
    samples in one flat workspace.

    The input occupies acts[: capacity * C*H*W]; each row's output follows.
    Each kind lowers its own layers (a "same" conv is a pad row and a valid
    conv, a ReLU works in place, a flatten of a map without junk columns
    costs nothing, a pool writes inside the zero border the next layer
    wants); the fusion step here joins a ReLU to its neighbour (`_fuse_relu`).
    Rows whose passes need scratch (conv paths) share one region, as large
    as the largest needs, after the activations.
    """
    shapes = layer_shapes(arch)
    slice_size = min(capacity, slice_size or capacity)
    lo = Lowering(arch.input_shape, capacity, slice_size,
                  {name: off for name, _, off in layout}, layers.CODES)
    for i, ls in enumerate(shapes):
        nxt = shapes[i + 1] if i + 1 < len(shapes) else None
        if isinstance(ls.layer, ReLU) and _fuse_relu(lo, nxt):
            continue
        kind_of(ls.layer).lower(lo, ls, nxt)
    table = ops.assign(lo.finish())
    return Lowered(table, lo.acts, max(lo.argmax, 1), slice_size)


def _fuse_relu(lo: Lowering, nxt: LayerShape | None) -> bool:
    """The fusion step: a ReLU right before a kind that applies it to its
    input (Kind.relu_before: max and ReLU commute) or right after a row that
    applies it to its output (RowOp.relu_after, not yet fused) is no row of
    its own. False: it is."""
    if nxt is not None and kind_of(nxt.layer).relu_before:
        lo.relu = True
        return True
    last = lo.rows[-1] if lo.rows else None
    if last is not None and layers.ROW_OPS[last[P_OP]].relu_after and not last[P_RELU]:
        last[P_RELU] = 1
        return True
    return False


class Workspace:
    """A worker's preallocated buffers for batches of up to `capacity` samples:
    activations (every map but the input for `slice_size` of them), their
    gradients, pooling indices, the parameter gradient and the batch's
    labels. Nothing on the step path allocates. `plan` is the int64
    plan table for these buffers, `net` the plan with its compiled ops
    (compiled now, if this process has not yet)."""

    def __init__(self, lowered: Lowered, num_params: int, capacity: int, *,
                 backward: bool = True):
        self.plan = lowered.table
        self.slice_size = lowered.slice_size
        self.net = ops.network(self.plan, self.slice_size)
        self.acts_size = lowered.acts_size
        self.capacity = capacity
        self.acts = np.zeros(lowered.acts_size, np.float32)
        # the activation gradients, then (a batch in slices) a partial gradient
        part = num_params if lowered.slice_size < capacity else 0
        self.dacts = np.zeros(lowered.acts_size + part if backward else 1, np.float32)
        self.argmax = np.zeros(lowered.argmax_size, np.int32)
        self.grad = np.zeros(num_params if backward else 1, np.float32)
        self.labels = np.zeros(capacity, np.int64)
        self.codes = np.zeros((capacity, augment.CODES), np.int64)  # a batch's augmentation
        self.aug_rng = np.zeros(1, np.uint64)

    def __getstate__(self) -> dict:
        # compiled ops do not pickle (a Model travels to Ray's node actors
        # with its evaluation workspace): the copy compiles, or loads, its own
        return {k: v for k, v in vars(self).items() if k != "net"}

    def __setstate__(self, state: dict) -> None:
        vars(self).update(state)
        self.net = ops.network(self.plan, self.slice_size)

    @property
    def buffers(self) -> Buffers:
        """These buffers as network.train_steps takes them."""
        return Buffers(self.grad, self.net, self.acts, self.dacts, self.argmax, self.labels,
                       self.codes, self.aug_rng)


class Model:
    """A network on one flat float32 parameter array.

    `layout` lists (name, shape, offset) of each tensor; shapes follow PyTorch
    (conv (out, in, kh, kw), dense (out, in), flatten in C order of (C, H, W)).
    """

    def __init__(self, name: str, arch: Architecture):
        self.shapes = layer_shapes(arch)  # checks the layers: ValueError if they don't fit
        self.name = name
        self.arch = arch
        self.layout = parameter_layout(arch)
        _, last_shape, last_off = self.layout[-1]
        self.num_params = last_off + math.prod(last_shape)
        self.num_trained = trained_size(arch, self.layout)  # running statistics follow
        self._eval_ws: Workspace | None = None

    @property
    def spec(self) -> str:
        """The canonical spec string of the layers (what `--model` would take)."""
        return spec_string(self.arch.layers)

    def summary(self) -> str:
        """A table of each layer's output shape and parameter count (print it)."""
        rows = [(ls.layer.spec() if not ls.params else f"{ls.name} {ls.layer.spec()}",
                 "x".join(map(str, ls.shape)),
                 f"{sum(math.prod(shape) for _, shape in ls.params):,}") for ls in self.shapes]
        rows = [("layer", "output", "parameters"), *rows, ("total", "", f"{self.num_params:,}")]
        # columns as wide as their widest entry: a long spec never pushes a row out of line
        w0, w1, w2 = (max(len(row[i]) for row in rows) for i in range(3))
        return "\n".join([f"{self.name}: input {'x'.join(map(str, self.input_shape))}, "
                          f"{self.num_classes} classes",
                          *(f"{a:<{w0}} {b:>{w1}} {c:>{w2}}" for a, b, c in rows)])

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

    def layout_shape(self, name: str) -> tuple[int, ...]:
        """The shape of the parameter tensor `name` (e.g. "conv1.weight")."""
        return next(shape for n, shape, _ in self.layout if n == name)

    def tensors(self, params: np.ndarray) -> dict[str, np.ndarray]:
        """Named views (not copies) of the tensors inside a flat array."""
        return {name: params[off:off + math.prod(shape)].reshape(shape)
                for name, shape, off in self.layout}

    def init(self, seed: int) -> np.ndarray:
        """Seeded PyTorch-default initialisation, flat float32.

        Weights and biases ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), which is what
        torch.nn.Conv2d/Linear do (Kaiming-uniform with a = sqrt(5)). The paper's
        N(0, 0.01) leaves LeNet-5 stuck at loss ln(10) for epochs. Tensors a
        kind starts at a constant (Kind.initial: batch norm's) take it.
        """
        rng = np.random.default_rng(seed)
        params = np.empty(self.num_params, np.float32)
        constants = {name: kind_of(ls.layer).initial.get(name.rsplit(".", 1)[1])
                     for ls in self.shapes for name, _ in ls.params}
        fan_in = 1
        for name, shape, off in self.layout:
            size = math.prod(shape)
            if constants[name] is not None:  # batch norm's: 1, 0, mean 0, variance 1
                params[off:off + size] = constants[name]
                continue
            if name.endswith(".weight"):
                fan_in = math.prod(shape[1:])
            bound = 1.0 / math.sqrt(fan_in)
            params[off:off + size] = rng.uniform(-bound, bound, size)
        return params

    def workspace(self, capacity: int, *, backward: bool = True) -> Workspace:
        """Fresh buffers for batches of up to `capacity` samples, run through
        the network `slice_size` at a time (the module's slice rule)."""
        if capacity < 1:
            raise ValueError(f"batch capacity must be >= 1, got {capacity}")
        return Workspace(self.lowered(capacity), self.num_params, capacity, backward=backward)

    def lowered(self, capacity: int) -> Lowered:
        """The plan and workspace sizes for batches of up to `capacity`
        samples, sliced by the module's rule (slice_size)."""
        return lower(self.arch, self.layout, capacity,
                               slice_size(self.arch, self.layout, self.num_params, capacity))

    # ---- convenience API (allocates; the training path uses the kernels directly)

    def loss_and_grad(self, params: np.ndarray, x: np.ndarray, y: np.ndarray,
                      label_smoothing: float = 0.0) -> tuple[float, np.ndarray]:
        """Batch-mean softmax cross-entropy (with nn.CrossEntropyLoss's
        label_smoothing) and its flat gradient (train mode: batch norm by the
        batch's statistics, which its running statistics' entries hold).

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
        loss = network.network_loss_and_grad(params, ws.grad, ws.net, ws.acts, ws.dacts,
                                             ws.argmax, labels, float(label_smoothing))
        return float(loss), ws.grad

    def logits(self, params: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Raw scores (N, num_classes) for float32 inputs in [0, 1]."""
        params = self._check_params(params)
        x2 = self._flat_inputs(x)
        ws = self.workspace(max(x2.shape[0], 1), backward=False)
        last = ws.plan[-1]
        off, width = last[P_ZOFF], last[P_CO]
        out = np.empty((x2.shape[0], width), np.float32)
        for start in range(0, x2.shape[0], ws.slice_size):  # as many as the maps hold
            rows = x2[start:start + ws.slice_size]
            n = rows.shape[0]
            self._load_inputs(rows, ws)
            network.network_forward(params, ws.grad[:0], ws.net, ws.acts, ws.argmax, n)
            out[start:start + n] = ws.acts[off:off + n * width].reshape(n, width)
        return out

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
        network.predict_images(params, ws.net, ws.acts, ws.argmax,
                               images.reshape(images.shape[0], -1), *self.image_transform, out)
        return out

    def _load_inputs(self, x2: np.ndarray, ws: Workspace) -> None:
        """Put (N, D) inputs in [0, 1] into the workspace as network inputs."""
        network.affine_copy(x2, 1.0 / INPUT_STD, -INPUT_MEAN / INPUT_STD, ws.acts[:x2.size])

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


def build(name: str | Sequence[Layer], dataset: str | None = "cifar10", *,
          input_shape: tuple[int, int, int] | None = None,
          num_classes: int | None = None,
          hidden: tuple[int, ...] | None = None) -> Model:
    """The model `name` sized for `dataset`: a preset ("lenet", "mlp",
    "vgg-small", "vgg-bn"), a spec string ("conv32k3s,relu,pool,dense") or a list of
    layers ([Conv(32, 3, "same"), ReLU(), Pool(), Dense()]).

    input_shape / num_classes override the dataset's (for tests and new data);
    hidden sets the MLP's widths (default 128,128,128). Raises ValueError with
    one line for anything that does not fit.
    """
    if dataset is not None and dataset not in DATASET_SHAPES:
        raise ValueError(f"unknown dataset {dataset!r}; choose from {', '.join(DATASET_SHAPES)}")
    base_shape, base_classes = DATASET_SHAPES[dataset] if dataset else (None, None)
    shape = input_shape or base_shape
    classes = num_classes or base_classes
    if shape is None or classes is None:
        raise ValueError("give a dataset or both input_shape and num_classes")
    shape = tuple(shape)
    if hidden is not None and name != "mlp":
        raise ValueError("--hidden applies to the mlp model only")
    if not isinstance(name, str):
        layers = tuple(name)
        return Model(spec_string(layers), Architecture(shape, layers, classes))
    if name == "lenet":
        return Model(name, lenet(shape, classes))
    if name == "mlp":
        return Model(name, mlp(shape, classes, tuple(hidden or DEFAULT_HIDDEN)))
    if name in SPEC_PRESETS:
        return Model(name, Architecture(shape, tuple(parse_spec(SPEC_PRESETS[name])), classes))
    try:
        layers = tuple(parse_spec(name))
    except ValueError as e:
        raise ValueError(f"unknown model {name!r}: not a preset ({', '.join(MODELS)}) "
                         f"nor a spec: {e}") from None
    return Model(name, Architecture(shape, layers, classes))
