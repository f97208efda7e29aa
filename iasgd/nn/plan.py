"""The plan format: the one contract between the layer kinds and the network passes.

The whole network is described to the compiled code by one int64 table, the
*plan* (built by `iasgd.nn.models` from the layer kinds' lowerings): one row
per op, in forward order, holding the row's op, its input and output
shapes, and offsets into the flat parameter array, the activation workspace
and the pooling-index workspace. The columns are named below; unused ones
are 0.

Conventions every kernel keeps:
- Activations are float32, C-contiguous, NCHW with a *row stride* S >= the
  valid width W: a plane is H rows of S floats, of which the first W hold the
  map and the rest are junk. Dense activations are (N, D).
- A convolution is k x k (k odd), valid, stride 1 ("same" padding is a pad
  row in front of it). It reads an input of row stride S and writes its
  output with the *same* row stride ("wide" rows): an (OH, OW) = (H-k+1,
  W-k+1) result occupies columns ow < OW of (OH, S) rows. This turns the
  whole plane into one long contiguous loop per kernel row, which LLVM
  vectorises well; short rows of 10 or 16 would not. Gradients flowing back
  into a wide plane are zero in the junk columns (every backward guarantees
  it), so junk never reaches a weight gradient.
- Weights follow PyTorch: conv (out, in, k, k), dense (out, in).
- Every function is pure on arrays the caller preallocated, compiled with the
  GIL released: no I/O, no Python objects, no allocation on the training
  path. Some passes call BLAS (numba's three-argument np.dot, which calls
  scipy's OpenBLAS without the GIL and without allocating): run them under
  `iasgd.nn.blas.single_threaded_blas()` (the executors do).

Each row has three passes: its forward, the gradient of its weights and the
gradient of its input. Each is an *op function* of a layer kind
(iasgd.nn.layers), or `nothing`, all with one signature:

    op(params, grad, plan, i, acts, dacts, argmax, n)

for row i of `plan` and a slice of n samples. iasgd.nn.ops compiles each as
a C callback, only those a plan uses, into the table (Net.ops) that the
network passes (iasgd.nn.network) call through the row's P_FWD, P_DW and
P_DX columns. The forward ops leave grad and dacts alone.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from iasgd.compiled import jit_inline

# train_steps' arguments in bundles (named tuples, which numba passes as one):
# params, velocity: (P,) float32; grad: (P,); net: the network (Net below);
# acts, dacts, argmax: the workspace; batch_labels: (b,) int64 scratch;
# codes: (b, 3) int64 scratch of a batch's augmentation codes, aug_rng: (1,)
# uint64 scratch of a step's augmentation stream (iasgd.nn.augment);
# images (M, D) uint8 -> images * scale + shift; labels (M,) int64;
# shape: (C, H, W) of an image (D = C*H*W), pad: the random crop's padding
# (0: no crop), flip: random horizontal flips (iasgd.nn.augment; the
# defaults: no augmentation);
# order: (M,) int64 permutation; first, count: the steps to run; sgd: an Sgd;
# epoch_start: updates the run applied before this epoch's step 0; aug_seed:
# (uint64) this epoch's augmentation seed (augment.seed_step).
Weights = namedtuple("Weights", ["params", "velocity"])
Buffers = namedtuple("Buffers", ["grad", "net", "acts", "dacts", "argmax", "batch_labels",
                                 "codes", "aug_rng"])
Images = namedtuple("Images", ["images", "labels", "scale", "shift", "shape", "pad", "flip"],
                    defaults=[(0, 0, 0), 0, False])
Steps = namedtuple("Steps", ["order", "first", "count", "batch_size", "sgd", "epoch_start",
                             "aug_seed"], defaults=[np.uint64(0)])
# A step's hyper-parameters, as torch.optim.SGD (dampening 0) and
# nn.CrossEntropyLoss name them: lr, momentum, weight_decay (floats),
# nesterov (bool), label_smoothing (float in [0, 1)); and the step size's
# schedule over the run (iasgd.nn.network.scheduled_lr): decay (int, the
# position in iasgd.schedules.LR_DECAYS), warmup and planned (updates); and
# trained: the parameters [0, trained) are trained, the rest are running
# statistics (batch norm's), which follow their batches' instead
# (iasgd.nn.network.sgd_momentum_update).
Sgd = namedtuple("Sgd", ["lr", "momentum", "weight_decay", "nesterov", "label_smoothing",
                         "decay", "warmup", "planned", "trained"])
ALL_TRAINED = 1 << 62  # Sgd.trained of a model without running statistics


def plain_sgd(lr: float, momentum: float, trained: int = ALL_TRAINED) -> Sgd:
    """The paper's step: heavy ball, no weight decay, hard labels, one step
    size throughout."""
    return Sgd(float(lr), float(momentum), 0.0, False, 0.0, 0, 0, 0, int(trained))


def knobs_argument(sgd: Sgd, num_params: int) -> bool | None:
    """network.train_steps' `knobs` for `sgd` on a model of num_params
    parameters: None where it is the paper's step (heavy ball at a constant
    step size on hard labels, every parameter trained: plain_sgd's), else
    True. numba drops the branches on `knobs is None` before typing, so the
    paper's steps never compile weight decay, Nesterov, label smoothing, the
    schedule or the running statistics' update (docs/performance.md: the
    default job's cold start)."""
    paper = (sgd.weight_decay == 0.0 and not sgd.nesterov and sgd.label_smoothing == 0.0
             and sgd.decay == 0 and sgd.warmup == 0 and sgd.trained >= num_params)
    return None if paper else True


# A network as the compiled code runs it: the int64 plan table, the table of
# compiled ops its rows' P_FWD, P_DW and P_DX columns index (iasgd.nn.ops),
# and `slice_size`: how many samples a pass runs on at most (the capacity of the
# plan's activations; network_loss_and_grad runs a larger batch in slices).
Net = namedtuple("Net", ["plan", "ops", "slice_size"])

# Columns of a plan row. OP: which kind of row (its position in
# iasgd.nn.layers.ROW_OPS; the compiled code never reads it). Input (C, H, W)
# with row stride S at XOFF; output (CO, OH, OW) with row stride OS at ZOFF
# (dense tensors: H = W = S = 1); K: kernel size (conv), border (pad, and a
# pool that writes inside the next conv's padding); WOFF, BOFF: weights and
# bias in the parameters; AOFF: pooling indices; RELU: a fused ReLU; GRAD: 1
# if the row's input needs a gradient (a row before it has parameters), else
# its backward stops at its own weights; PATH: how a conv runs its passes
# (GEMM or explicit-vector bits, iasgd.nn.layers.conv); COFF: where the
# scratch of those paths starts in acts (forward) and dacts
# (backward); SOFF: running statistics in the parameters (batch norm).
# FWD, DW, DX: the positions in the op table (Net.ops) of the row's forward,
# weight-gradient and input-gradient functions (iasgd.nn.ops fills them in).
(P_OP, P_C, P_H, P_W, P_S, P_CO, P_OH, P_OW, P_OS, P_K, P_XOFF, P_ZOFF, P_WOFF, P_BOFF,
 P_AOFF, P_RELU, P_GRAD, P_PATH, P_COFF, P_SOFF, P_FWD, P_DW, P_DX) = range(23)
PLAN_COLUMNS = 23


def nothing(params, grad, plan, i, acts, dacts, argmax, n):
    """A pass that has nothing to do (a row without weights; an input that
    needs no gradient)."""


# ------------------------------------------------------------------ views


@jit_inline
def view2(flat, off, a, b):
    return flat[off:off + a * b].reshape((a, b))


@jit_inline
def view3(flat, off, a, b, c):
    return flat[off:off + a * b * c].reshape((a, b, c))


@jit_inline
def view4(flat, off, a, b, c, d):
    return flat[off:off + a * b * c * d].reshape((a, b, c, d))


@jit_inline
def input4(flat, row, n):
    """A row's input map (n, C, H, S) inside acts or dacts."""
    return view4(flat, row[P_XOFF], n, row[P_C], row[P_H], row[P_S])


@jit_inline
def output4(flat, row, n):
    """A row's output map (n, CO, OH, OS) inside acts or dacts."""
    return view4(flat, row[P_ZOFF], n, row[P_CO], row[P_OH], row[P_OS])


@jit_inline
def output3(flat, row, n):
    """A row's output (n, CO, OH*OS), a plane per channel."""
    return view3(flat, row[P_ZOFF], n, row[P_CO], row[P_OH] * row[P_OS])


@jit_inline
def input2(flat, row, n):
    """A dense row's input (n, C)."""
    return view2(flat, row[P_XOFF], n, row[P_C])


@jit_inline
def output2(flat, row, n):
    """A dense row's output (n, CO)."""
    return view2(flat, row[P_ZOFF], n, row[P_CO])


@jit_inline
def bias(flat, row):
    """A row's bias (CO,) inside the parameters or their gradient."""
    return flat[row[P_BOFF]:row[P_BOFF] + row[P_CO]]


# ------------------------------------------------------------ shared loops


@jit_inline
def copy_values(src, dst):
    """dst[i] = src[i] for the 1-D arrays' src.size elements. A loop, not slice
    assignment: numba compiles a shape-mismatch error path for every slice
    assignment (string formatting, ~2 s of compile time per caller's flags)."""
    for i in range(src.size):
        dst[i] = src[i]


@jit_inline
def add_values(src, dst):
    """dst[i] += src[i] for the 1-D arrays' src.size elements (a loop from 0:
    no wraparound checks, so it vectorises)."""
    for i in range(src.size):
        dst[i] += src[i]


@jit_inline
def total(v):
    """The sum of a 1-d array, in its dtype."""
    s = v.dtype.type(0)
    for i in range(v.size):
        s += v[i]
    return s
