"""The models: their layers, parameter layout, workspace plan, initialisation and API.

A model is a list of layers, the one description everything else is computed
from, here and only here: the parameter layout in the flat float32 array
(`Model.layout`) and the plan, one int64 table that the compiled kernels loop
over (`iasgd.nn.kernels`, one row per op), with every activation's offset in a
worker's flat workspace.

Layers: `Conv(out, k, padding)` (k odd, stride 1, "valid" or "same"), `ReLU()`,
`Pool()` (2x2 max, stride 2, floor), `Flatten()`, `Dense(out)`; the last layer
is the dense output layer (`Dense()` takes the dataset's class count). A dense
layer after a spatial map flattens it (C order, as PyTorch's `flatten(1)`).
The compact spec string (`--model`) is the same list, `docs/models.md` has its
grammar. Presets:

- lenet, CIFAR-10 (3x32x32):  conv 3->6, conv 6->16, dense 400->120->10  (52,202)
- lenet, CIFAR-100:           same convs, dense 400->120->84->100        (69,656)
- lenet, Fashion-MNIST (1x28x28): conv 1->6, conv 6->16, dense 256->120->10 (34,622)
- mlp: dense layers only, hidden widths configurable (default 128,128,128).
- vgg-small, CIFAR-10: two 3x3 same conv blocks (32, 64 channels) with pooling,
  dense 4096->128->10 (545,098).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from iasgd.data.registry import DATASETS
from iasgd.nn import kernels as K
from iasgd.nn import ops, simd

MODELS = ("lenet", "mlp", "vgg-small")  # the presets; --model also takes a spec
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


# ------------------------------------------------------------------ layers


@dataclass(frozen=True)
class Conv:
    """k x k convolution, stride 1; padding "valid" (none) or "same" ((k-1)/2)."""

    out: int
    k: int = 3
    padding: str = "valid"

    def spec(self) -> str:
        return f"conv{self.out}k{self.k}{self.padding[0]}"


@dataclass(frozen=True)
class ReLU:
    def spec(self) -> str:
        return "relu"


@dataclass(frozen=True)
class Pool:
    """2x2 max-pool, stride 2 (floor for odd sizes)."""

    def spec(self) -> str:
        return "pool"


@dataclass(frozen=True)
class Flatten:
    def spec(self) -> str:
        return "flatten"


@dataclass(frozen=True)
class Dense:
    """Fully connected; out=None only for the output layer (the class count)."""

    out: int | None = None

    def spec(self) -> str:
        return "dense" if self.out is None else f"dense{self.out}"


Layer = Conv | ReLU | Pool | Flatten | Dense

_TOKEN = re.compile(r"conv(?P<out>\d+)(?:k(?P<k>\d+))?(?P<pad>[sv])?|relu|pool|flatten"
                    r"|dense(?P<dout>\d*)")
SPEC_HELP = ("layers: conv<C>[k<K>][s|v] (C channels, odd kernel K, default 3, "
             "s = same or v = valid padding, default v), relu, pool, flatten, dense<N>, "
             "and last the output layer dense or dense<classes>")


def parse_spec(spec: str) -> list[Layer]:
    """The layers of a spec string like "conv32k3s,relu,pool,dense128,relu,dense".

    Only the grammar is checked here; shapes are checked against a dataset by
    `build`. Raises ValueError naming the bad token.
    """
    layers: list[Layer] = []
    tokens = [t.strip() for t in spec.lower().split(",")]
    for i, token in enumerate(tokens, start=1):
        m = _TOKEN.fullmatch(token)
        if m is None:
            raise ValueError(f"unknown layer {token!r} (layer {i}); {SPEC_HELP}")
        if token.startswith("conv"):
            pad = {"s": "same", "v": "valid", None: "valid"}[m["pad"]]
            layers.append(Conv(int(m["out"]), int(m["k"] or 3), pad))
        elif token.startswith("dense"):
            layers.append(Dense(int(m["dout"]) if m["dout"] else None))
        else:
            layers.append({"relu": ReLU(), "pool": Pool(), "flatten": Flatten()}[token])
    return layers


def spec_string(layers: Sequence[Layer]) -> str:
    """The canonical spec string of a layer list (parse_spec's inverse)."""
    return ",".join(layer.spec() for layer in layers)


@dataclass(frozen=True)
class Architecture:
    """The layer list with the input shape and class count it is sized for."""

    input_shape: tuple[int, int, int]
    layers: tuple[Layer, ...]
    num_classes: int


@dataclass(frozen=True)
class LayerShape:
    """A layer with its output shape ((C, H, W) or (D,)) and parameter tensors."""

    layer: Layer
    name: str  # conv1, fc2, relu, ... (parameter tensors are <name>.weight/.bias)
    shape: tuple[int, ...]
    params: tuple[tuple[str, tuple[int, ...]], ...]


def lenet(input_shape: tuple[int, int, int], num_classes: int) -> Architecture:
    """LeNet-5 as in the paper (two conv blocks, dense head by class count)."""
    hidden = LENET_HIDDEN.get(num_classes, (120, 84))
    layers = [Conv(6, 5), ReLU(), Pool(), Conv(16, 5), ReLU(), Pool()]
    for width in hidden:
        layers += [Dense(width), ReLU()]
    return Architecture(tuple(input_shape), (*layers, Dense()), num_classes)


def mlp(input_shape: tuple[int, int, int], num_classes: int,
        hidden: tuple[int, ...] = DEFAULT_HIDDEN) -> Architecture:
    """Dense layers with ReLU on the flattened input."""
    layers: list[Layer] = []
    for width in hidden:
        layers += [Dense(width), ReLU()]
    return Architecture(tuple(input_shape), (*layers, Dense()), num_classes)


def layer_shapes(arch: Architecture) -> list[LayerShape]:
    """Check the layers against the input and give each one's output shape and
    parameters. Raises ValueError with one clear line for a net that does not fit."""
    if arch.num_classes < 2:
        raise ValueError(f"need at least 2 classes, got {arch.num_classes}")
    if not arch.layers:
        raise ValueError("a model needs at least its output layer (dense)")
    last = arch.layers[-1]
    if not isinstance(last, Dense):
        raise ValueError(f"the last layer must be the dense output layer, got "
                         f"{last.spec()!r}")
    if last.out is not None and last.out != arch.num_classes:
        raise ValueError(f"the output layer {last.spec()} must have {arch.num_classes} "
                         f"outputs, the class count (write 'dense' to take it)")
    shape: tuple[int, ...] = tuple(arch.input_shape)
    out: list[LayerShape] = []
    convs = denses = 0
    for i, layer in enumerate(arch.layers, start=1):
        where = f"{layer.spec()} (layer {i})"
        params: tuple[tuple[str, tuple[int, ...]], ...] = ()
        if isinstance(layer, Conv):
            if len(shape) != 3:
                raise ValueError(f"{where} needs an image, but the map was flattened before")
            if layer.out < 1:
                raise ValueError(f"{where}: zero channels")
            if layer.k < 1 or layer.k % 2 == 0:
                raise ValueError(f"{where}: the kernel size must be odd, got {layer.k}")
            if layer.padding not in ("valid", "same"):
                raise ValueError(f"{where}: padding must be 'valid' or 'same'")
            c, h, w = shape
            if layer.padding == "valid":
                if h < layer.k or w < layer.k:
                    raise ValueError(f"{where}: its {h}x{w} input is too small for a "
                                     f"{layer.k}x{layer.k} valid conv")
                h, w = h - layer.k + 1, w - layer.k + 1
            convs += 1
            name = f"conv{convs}"
            params = ((f"{name}.weight", (layer.out, c, layer.k, layer.k)),
                      (f"{name}.bias", (layer.out,)))
            shape = (layer.out, h, w)
        elif isinstance(layer, Pool):
            if len(shape) != 3:
                raise ValueError(f"{where} needs an image, but the map was flattened before")
            c, h, w = shape
            if h < 2 or w < 2:
                raise ValueError(f"{where}: its {h}x{w} input is too small for a 2x2 pool")
            name, shape = "pool", (c, h // 2, w // 2)
        elif isinstance(layer, Dense):
            width = layer.out if layer.out is not None else arch.num_classes
            if layer.out is None and i < len(arch.layers):
                raise ValueError(f"{where}: only the output layer may omit its width")
            if width < 1:
                raise ValueError(f"{where}: zero outputs")
            denses += 1
            name = f"fc{denses}"
            params = ((f"{name}.weight", (width, math.prod(shape))), (f"{name}.bias", (width,)))
            shape = (width,)
        elif isinstance(layer, Flatten):
            name, shape = "flatten", (math.prod(shape),)
        elif isinstance(layer, ReLU):
            name = "relu"
        else:
            raise ValueError(f"unknown layer {layer!r}")
        out.append(LayerShape(layer, name, shape, params))
    return out


def parameter_layout(arch: Architecture) -> list[tuple[str, tuple[int, ...], int]]:
    """(name, shape, offset) of every tensor in the flat parameter array."""
    layout: list[tuple[str, tuple[int, ...], int]] = []
    offset = 0
    for ls in layer_shapes(arch):
        for name, shape in ls.params:
            layout.append((name, shape, offset))
            offset += math.prod(shape)
    return layout


@dataclass(frozen=True)
class Plan:
    """The kernels' plan for a batch capacity, and the workspace it needs.

    table: (ops, PLAN_COLUMNS) int64, one row per op (iasgd.nn.kernels);
    acts_size / argmax_size: float32 / int32 workspace lengths; slice_size:
    the samples that every activation but the input has room for (a batch
    runs through the network that many at a time).
    """

    table: np.ndarray
    acts_size: int
    argmax_size: int
    slice_size: int


# Which passes of a 3x3 or 5x5 conv run as BLAS GEMMs rather than the direct
# kernels: the input gradient from 32 output channels on. Measured
# single-threaded, GFLOP/s of the whole pass (im2col/col2im included), direct
# vs GEMM, b = 16: input gradient 32 -> 64 3x3 (vgg-small): 45 vs 59, 6 -> 16
# 5x5 (LeNet-5): 34 vs 31; weight gradient 67 vs 53 and 46 vs 25; forward 49 vs
# 46 and 38 vs 17; the convs from 3 channels (3 -> 6 5x5, 3 -> 32 3x3) are
# direct in every pass by a factor of 1.2-7.
GEMM_INPUT_MIN_CHANNELS = 32
# The explicit-vector forwards where the machine has the registers they are
# written for (IASGD_SIMD=0 turns them off, e.g. to compare).
# - 5x5 (16 output channels in the lanes): from 64 taps per output, and where
#   a sample's input and a group of 16 channels' weights fit in 32 KB (L1 is
#   48 KB here). Measured alone, b = 16, GFLOP/s direct vs vectors: LeNet-5's
#   6 -> 16 (150 taps, 14 KB) 62 vs 171. The same scheme on vgg-small's 3x3
#   convs was slower in place (3 -> 32: 88 vs 71; 32 -> 64: 89 vs 75 at b = 64).
# - 3x3 (16 output pixels of a row in the lanes, conv3_forward_simd): every
#   conv with output channels in whole blocks of K.SIMD3_CHANNELS, 16 columns
#   and 2 rows. Alone, b = 8: vgg-small's 32 -> 64 98 vs 228, 3 -> 32 91 vs 171.
SIMD = simd.available() and os.environ.get("IASGD_SIMD", "1") != "0"
SIMD_MIN_TAPS = 64
SIMD_MAX_FLOATS = 8192
# The explicit-vector weight gradient of a 5x5 conv with whole vectors of
# output channels, from 100 taps per output (4 input channels). Alone, b =
# 16, GFLOP/s direct vs vectors: 6 -> 16 on 14x14 (LeNet-5) 57-70 vs 141,
# 32 -> 64 on 12x12 53 vs 189, 8 -> 16 on 16x16 84 vs 162, 6 -> 32 on 9x9
# 25 vs 115; on 32x32 maps, where the direct kernel's rows are long, 4 -> 16
# 113 vs 113 and 3 -> 16 (75 taps) 127 vs 95.
SIMD_WEIGHTS_MIN_TAPS = 100


def conv_paths(k: int, out: int, needs_input_grad: bool, out_width: int = 0,
               channels: int = 0, in_floats: int = 0, out_height: int = 0) -> int:
    """The GEMM and SIMD bits (kernels.GEMM_*, SIMD_*) of a k x k conv
    from `channels` to `out` channels with `out_width` output columns and
    `in_floats` floats of input per sample (C*H*S), and `out_height` output
    rows: other sizes than 3x3 and 5x5 run every pass as GEMMs. On a machine
    with AVX-512 some passes run as explicit vectors (iasgd.nn.simd): a 5x5
    conv with whole vectors of output channels, its forward with a block's
    width of columns, SIMD_MIN_TAPS taps (channels * k * k) or more, and an
    input that fits in L1 beside a group of weights (SIMD_MAX_FLOATS), its
    weight gradient from SIMD_WEIGHTS_MIN_TAPS taps; a 3x3 conv's forward
    with whole blocks of K.SIMD3_CHANNELS output channels, a vector's width
    of columns and two rows."""
    if k not in (3, 5):
        return K.GEMM_ALL
    bits = 0
    taps = channels * k * k
    vectors = SIMD and k == 5 and out % simd.LANES == 0
    if (vectors and out_width >= K.SIMD_BLOCK and taps >= SIMD_MIN_TAPS
            and in_floats + taps * simd.LANES <= SIMD_MAX_FLOATS):
        bits |= K.SIMD_FORWARD
    if vectors and taps >= SIMD_WEIGHTS_MIN_TAPS:
        bits |= K.SIMD_WEIGHTS
    if (SIMD and k == 3 and out % K.SIMD3_CHANNELS == 0 and out_width >= simd.LANES
            and out_height >= 2):
        bits |= K.SIMD_FORWARD
    if needs_input_grad and out >= GEMM_INPUT_MIN_CHANNELS:
        bits |= K.GEMM_INPUT
    return bits


def simd_scratch(c: int, k: int, out: int, out_pixels: int, bits: int) -> int:
    """Floats of scratch the explicit-vector passes of a conv need (`bits`:
    its SIMD_* bits): conv5_forward_lanes the reordered weights and one
    block of accumulators, conv3_forward_lanes the reordered weights,
    conv5_weights_lanes a sample's output gradient of 16 channels and their
    weight gradient."""
    block = K.SIMD_BLOCK * simd.LANES if k == 5 else 0
    forward = c * k * k * out + block if bits & K.SIMD_FORWARD else 0
    weights = (out_pixels + c * k * k) * simd.LANES if bits & K.SIMD_WEIGHTS else 0
    return max(forward, weights)


# A batch runs through the network SLICE_SAMPLES samples at a time when its
# activations and their gradients overflow a core's L2 cache (L2_BYTES)
# while the parameters fit in half of it: a slice's activations then stay in
# L2, and the parameters and the partial gradient, read once more per slice,
# stay there too. LeNet-5 at b = 64 (6.2 MB of activations, 0.2 MB of
# parameters), whole batch vs slices of 16 taking turns in one process,
# seven processes: 0.97-1.12x, median 1.07x (slices of 8 and 32 alike); b =
# 128: 1.06x. With parameters larger than the cache the extra reads cost
# more than the slices save (samples/s, whole vs slices of 32 / 16): mlp
# (1.7 MB) at b = 64 49.3 k vs 38.9 / 47.2 k; vgg-small (2.1 MB) 2.57 k vs
# 2.47 / 2.55 k.
L2_BYTES = 1 << 20  # this machine's (AMD EPYC) and many current x86 cores'
SLICE_SAMPLES = 16


def slice_size(arch: Architecture, layout: list, num_params: int, capacity: int) -> int:
    """How many samples of a batch of up to `capacity` run through the
    network at a time: all of them or SLICE_SAMPLES (the rule above)."""
    one, two = (activation_plan(arch, layout, n).acts_size for n in (1, 2))
    batch_bytes = 8 * (two - one) * capacity  # activations and their gradients
    if capacity > SLICE_SAMPLES and batch_bytes > L2_BYTES and 8 * num_params <= L2_BYTES:
        return SLICE_SAMPLES
    return capacity


def activation_plan(arch: Architecture, layout: list, capacity: int,
                    slice_size: int | None = None) -> Plan:
    """Lower the layers to kernel ops and lay out the activations of `capacity`
    samples in one flat workspace.

    The input occupies acts[: capacity * C*H*W]; each op's output follows. What
    the lowering does, for speed with the same math: a ReLU right before a pool
    or right after a dense layer is fused into it (max and ReLU commute), a
    "same" conv is a pad op and a valid conv (right after a pool, no pad op:
    the pool writes inside the zero border), a ReLU works in place, and a
    flatten of a map without junk columns costs nothing. Convs that run a pass
    as a GEMM or in vectors (`conv_paths`) share one sample's scratch after
    the activations.
    """
    offsets = {name: off for name, _, off in layout}
    shapes = layer_shapes(arch)
    c, h, w = arch.input_shape
    s = w  # row stride of the current map
    spatial = True
    acts = capacity * c * h * w
    capacity = slice_size = min(capacity, slice_size or capacity)  # of every later map
    x_off, argmax = 0, 0
    has_params = False  # an op before this one has parameters: it needs a backward
    padded = False  # the map has the next conv's zero border already (a pool wrote it)
    scratch = 0  # floats of per-sample scratch that the GEMM convs share
    rows: list[list[int]] = []

    def emit(op: int, co: int, oh: int, ow: int, os_: int, z_off: int, **extra: int) -> None:
        row = [0] * K.PLAN_COLUMNS
        row[K.P_OP], row[K.P_C], row[K.P_H], row[K.P_W], row[K.P_S] = op, c, h, w, s
        row[K.P_CO], row[K.P_OH], row[K.P_OW], row[K.P_OS] = co, oh, ow, os_
        row[K.P_XOFF], row[K.P_ZOFF], row[K.P_GRAD] = x_off, z_off, int(has_params)
        for key, value in extra.items():
            row[getattr(K, f"P_{key}")] = value
        rows.append(row)

    def alloc(size: int) -> int:
        nonlocal acts
        off = acts
        acts += capacity * size
        return off

    i = 0
    while i < len(shapes):
        ls = shapes[i]
        layer = ls.layer
        if isinstance(layer, Conv):
            if layer.padding == "same" and layer.k > 1 and not padded:
                p = (layer.k - 1) // 2
                ph, pw = h + 2 * p, w + 2 * p
                z = alloc(c * ph * pw)
                emit(K.OP_PAD, c, ph, pw, pw, z, K=p)
                x_off, h, w, s = z, ph, pw, pw
            oh, ow = h - layer.k + 1, w - layer.k + 1
            z = alloc(layer.out * oh * s)  # wide rows: the input's stride
            gemm = conv_paths(layer.k, layer.out, has_params, ow, c, c * h * s, oh)
            ckk = c * layer.k * layer.k
            if gemm & K.GEMM_ALL:  # the column matrix, and two (C*k*k, out) weight gradients
                scratch = max(scratch, ckk * oh * s + 2 * ckk * layer.out)
            scratch = max(scratch, simd_scratch(c, layer.k, layer.out, oh * ow, gemm))
            emit(K.OP_CONV, layer.out, oh, ow, s, z, K=layer.k,
                 WOFF=offsets[f"{ls.name}.weight"], BOFF=offsets[f"{ls.name}.bias"],
                 GEMM=gemm)
            has_params = True
            x_off, (c, h, w) = z, (layer.out, oh, ow)
            padded = False
        elif isinstance(layer, Pool) or (isinstance(layer, ReLU) and i + 1 < len(shapes)
                                         and isinstance(shapes[i + 1].layer, Pool)):
            relu = isinstance(layer, ReLU)
            i += relu  # ReLU + pool, fused
            ph, pw = h // 2, w // 2
            nxt = shapes[i + 1].layer if i + 1 < len(shapes) else None
            # the padding of a "same" conv right after: the pool writes inside it
            b = (nxt.k - 1) // 2 if isinstance(nxt, Conv) and nxt.padding == "same" else 0
            z = alloc(c * (ph + 2 * b) * (pw + 2 * b))
            emit(K.OP_POOL, c, ph, pw, pw + 2 * b, z, AOFF=argmax, RELU=int(relu), K=b)
            argmax += capacity * c * ph * pw
            x_off, h, w = z, ph + 2 * b, pw + 2 * b
            s, padded = w, b > 0
        elif isinstance(layer, ReLU) and rows and rows[-1][K.P_OP] == K.OP_DENSE \
                and not rows[-1][K.P_RELU]:
            rows[-1][K.P_RELU] = 1  # dense + ReLU, fused
        elif isinstance(layer, ReLU):
            emit(K.OP_RELU, c, h, w, s, x_off)
        elif isinstance(layer, Flatten | Dense):
            if spatial:
                d = c * h * w
                if s != w:  # drop the junk columns
                    z = alloc(d)
                    emit(K.OP_FLATTEN, d, 1, 1, 1, z)
                    x_off = z
                spatial, (c, h, w, s) = False, (d, 1, 1, 1)
            if isinstance(layer, Dense):
                out = ls.shape[0]
                z = alloc(out)
                emit(K.OP_DENSE, out, 1, 1, 1, z,
                     WOFF=offsets[f"{ls.name}.weight"], BOFF=offsets[f"{ls.name}.bias"])
                has_params = True
                x_off, c = z, out
        i += 1
    if scratch:  # after the activations, once (the convs use it one sample at a time)
        for row in rows:
            if row[K.P_OP] == K.OP_CONV and row[K.P_GEMM]:
                row[K.P_COFF] = acts
        acts += scratch
    table = ops.assign(np.array(rows, dtype=np.int64).reshape(-1, K.PLAN_COLUMNS))
    return Plan(table, acts, max(argmax, 1), slice_size)


class Workspace:
    """A worker's preallocated buffers for batches of up to `capacity` samples:
    activations (every map but the input for `slice_size` of them), their
    gradients, pooling indices, the parameter gradient and the batch's
    labels. Nothing on the step path allocates. `plan` is the kernels' int64
    plan table for these buffers, `net` the plan with its compiled ops
    (compiled now, if this process has not yet)."""

    def __init__(self, plan: Plan, num_params: int, capacity: int, *, backward: bool = True):
        self.plan = plan.table
        self.slice_size = plan.slice_size
        self.net = ops.network(self.plan, self.slice_size)
        self.acts_size = plan.acts_size
        self.capacity = capacity
        self.acts = np.zeros(plan.acts_size, np.float32)
        # the activation gradients, then (a batch in slices) a partial gradient
        part = num_params if plan.slice_size < capacity else 0
        self.dacts = np.zeros(plan.acts_size + part if backward else 1, np.float32)
        self.argmax = np.zeros(plan.argmax_size, np.int32)
        self.grad = np.zeros(num_params if backward else 1, np.float32)
        self.labels = np.zeros(capacity, np.int64)

    def __getstate__(self) -> dict:
        # compiled ops do not pickle (a Model travels to Ray's node actors
        # with its evaluation workspace): the copy compiles, or loads, its own
        return {k: v for k, v in vars(self).items() if k != "net"}

    def __setstate__(self, state: dict) -> None:
        vars(self).update(state)
        self.net = ops.network(self.plan, self.slice_size)

    @property
    def buffers(self) -> K.Buffers:
        """These buffers as kernels.train_steps takes them."""
        return K.Buffers(self.grad, self.net, self.acts, self.dacts, self.argmax, self.labels)


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
        self._eval_ws: Workspace | None = None

    @property
    def spec(self) -> str:
        """The canonical spec string of the layers (what `--model` would take)."""
        return spec_string(self.arch.layers)

    def summary(self) -> str:
        """A table of each layer's output shape and parameter count (print it)."""
        lines = [f"{self.name}: input {'x'.join(map(str, self.input_shape))}, "
                 f"{self.num_classes} classes",
                 f"{'layer':<14} {'output':>12} {'parameters':>12}"]
        for ls in self.shapes:
            count = sum(math.prod(shape) for _, shape in ls.params)
            label = ls.layer.spec() if not ls.params else f"{ls.name} {ls.layer.spec()}"
            lines.append(f"{label:<14} {'x'.join(map(str, ls.shape)):>12} {count:>12,}")
        lines.append(f"{'total':<14} {'':>12} {self.num_params:>12,}")
        return "\n".join(lines)

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
        """Fresh buffers for batches of up to `capacity` samples, run through
        the network `slice_size` at a time (the module's slice rule)."""
        if capacity < 1:
            raise ValueError(f"batch capacity must be >= 1, got {capacity}")
        return Workspace(self.plan(capacity), self.num_params, capacity, backward=backward)

    def plan(self, capacity: int) -> Plan:
        """The plan of a workspace for batches of up to `capacity` samples,
        sliced by the module's rule (slice_size)."""
        return activation_plan(self.arch, self.layout, capacity,
                               slice_size(self.arch, self.layout, self.num_params, capacity))

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
        loss = K.network_loss_and_grad(params, ws.grad, ws.net, ws.acts, ws.dacts,
                                       ws.argmax, labels)
        return float(loss), ws.grad

    def logits(self, params: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Raw scores (N, num_classes) for float32 inputs in [0, 1]."""
        params = self._check_params(params)
        x2 = self._flat_inputs(x)
        ws = self.workspace(max(x2.shape[0], 1), backward=False)
        last = ws.plan[-1]
        off, width = last[K.P_ZOFF], last[K.P_CO]
        out = np.empty((x2.shape[0], width), np.float32)
        for start in range(0, x2.shape[0], ws.slice_size):  # as many as the maps hold
            rows = x2[start:start + ws.slice_size]
            n = rows.shape[0]
            self._load_inputs(rows, ws)
            K.network_forward(params, ws.net, ws.acts, ws.argmax, n)
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
        K.predict_images(params, ws.net, ws.acts, ws.argmax, images.reshape(images.shape[0], -1),
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


def build(name: str | Sequence[Layer], dataset: str | None = "cifar10", *,
          input_shape: tuple[int, int, int] | None = None,
          num_classes: int | None = None,
          hidden: tuple[int, ...] | None = None) -> Model:
    """The model `name` sized for `dataset`: a preset ("lenet", "mlp",
    "vgg-small"), a spec string ("conv32k3s,relu,pool,dense") or a list of
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
    if name == "vgg-small":
        return Model(name, Architecture(shape, tuple(parse_spec(VGG_SMALL)), classes))
    try:
        layers = tuple(parse_spec(name))
    except ValueError as e:
        raise ValueError(f"unknown model {name!r}: not a preset ({', '.join(MODELS)}) "
                         f"nor a spec: {e}") from None
    return Model(name, Architecture(shape, layers, classes))
