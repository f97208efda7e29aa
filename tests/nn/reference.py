"""Slow, obviously-correct numpy/scipy references the compiled kernels are
checked against, a central finite-difference helper, and the whole-model
checks every layer kind's tests share (float64 finite differences, PyTorch)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.signal import correlate
from scipy.special import logsumexp

FWD_RTOL = 1e-5  # float32 kernels vs float64 references, relative to the max
FD_RTOL = 1e-6   # float64 kernels vs central differences


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """The largest difference relative to the largest entry of b."""
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-12))


def conv2d_valid(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(N, C, H, W) x (O, C, k, k) -> (N, O, H-k+1, W-k+1), float64, via scipy."""
    N, C, H, W = x.shape
    O, _, k, _ = w.shape
    out = np.zeros((N, O, H - k + 1, W - k + 1))
    for n in range(N):
        for o in range(O):
            for c in range(C):
                out[n, o] += correlate(x[n, c].astype(np.float64), w[o, c].astype(np.float64),
                                       mode="valid")
            out[n, o] += b[o]
    return out


def relu_maxpool2(z: np.ndarray) -> np.ndarray:
    """ReLU then 2x2 max-pool (floor) of (N, C, H, W)."""
    N, C, H, W = z.shape
    z = z[:, :, : H // 2 * 2, : W // 2 * 2]
    pooled = z.reshape(N, C, H // 2, 2, W // 2, 2).max(axis=(3, 5))
    return np.maximum(pooled, 0)


def softmax_xent(logits: np.ndarray, labels: np.ndarray, smoothing: float = 0.0) -> float:
    """Batch-mean cross-entropy of softmax(logits) against the smoothed
    targets (1 - smoothing) * one_hot(labels) + smoothing / K."""
    logits = logits.astype(np.float64)
    log_p = logits - logsumexp(logits, axis=1, keepdims=True)
    target = np.full(logits.shape, smoothing / logits.shape[1])
    target[np.arange(len(labels)), labels] += 1 - smoothing
    return float(np.mean(-(target * log_p).sum(axis=1)))


def conv2d(x: np.ndarray, w: np.ndarray, b: np.ndarray, padding: str) -> np.ndarray:
    """conv2d_valid after zero-padding (k-1)/2 pixels all round for "same"."""
    if padding == "same":
        p = (w.shape[2] - 1) // 2
        x = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
    return conv2d_valid(x, w, b)


def maxpool2(z: np.ndarray) -> np.ndarray:
    """2x2 max-pool (floor) of (N, C, H, W), no ReLU."""
    N, C, H, W = z.shape
    z = z[:, :, : H // 2 * 2, : W // 2 * 2]
    return z.reshape(N, C, H // 2, 2, W // 2, 2).max(axis=(3, 5))


def network_logits(model, params: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Forward pass of a models.Model written with numpy/scipy, layer by layer
    from its layer list, by tensor name, in PyTorch's conventions (flatten in C
    order of (C, H, W)); x in [0, 1]."""
    from iasgd.nn.models import INPUT_MEAN, INPUT_STD, Conv, Dense, Flatten, Pool, ReLU

    t = {name: params[off:off + int(np.prod(shape))].reshape(shape).astype(np.float64)
         for name, shape, off in model.layout}
    a = (x.reshape(x.shape[0], *model.input_shape).astype(np.float64) - INPUT_MEAN) / INPUT_STD
    convs = denses = 0
    for layer in model.arch.layers:
        if isinstance(layer, Conv):
            convs += 1
            a = conv2d(a, t[f"conv{convs}.weight"], t[f"conv{convs}.bias"], layer.padding)
        elif isinstance(layer, ReLU):
            a = np.maximum(a, 0)
        elif isinstance(layer, Pool):
            a = maxpool2(a)
        elif isinstance(layer, Flatten):
            a = a.reshape(a.shape[0], -1)
        elif isinstance(layer, Dense):
            denses += 1
            a = a.reshape(a.shape[0], -1) @ t[f"fc{denses}.weight"].T + t[f"fc{denses}.bias"]
        else:
            raise TypeError(layer)
    return a


def central_difference(f: Callable[[np.ndarray], float], x: np.ndarray, index: int,
                       eps: float = 1e-6) -> float:
    """d f / d x.flat[index] by central differences (x is float64, restored)."""
    flat = x.reshape(-1)
    keep = flat[index]
    flat[index] = keep + eps
    up = f(x)
    flat[index] = keep - eps
    down = f(x)
    flat[index] = keep
    return (up - down) / (2 * eps)


# ------------------------------------------------------------ augmentation

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def splitmix64(state: int) -> tuple[int, int]:
    """The next (state, value) of the splitmix64 stream at `state`."""
    state = (state + GOLDEN) & MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return state, z ^ (z >> 31)


def augment_codes(state: int, n: int, pad: int, flip: bool) -> tuple[int, np.ndarray]:
    """The stream's state after, and the (n, 3) codes (dy, dx, f) drawn from
    it as the module doc of iasgd.nn.augment says: dy, dx uniform in
    [-pad, pad] (a draw each, when pad > 0), f the top bit of a draw (when
    flip)."""
    codes = np.zeros((n, 3), np.int64)
    for i in range(n):
        if pad > 0:
            state, z = splitmix64(state)
            codes[i, 0] = z % (2 * pad + 1) - pad
            state, z = splitmix64(state)
            codes[i, 1] = z % (2 * pad + 1) - pad
        if flip:
            state, z = splitmix64(state)
            codes[i, 2] = z >> 63
    return state, codes


def step_stream(base: int, step: int) -> int:
    """The first state of the sequential executor's step `step` stream from
    the epoch's seed `base`."""
    return splitmix64((base + GOLDEN * step) & MASK64)[1]


def pad_crop_flip(image: np.ndarray, dy: int, dx: int, f: int) -> np.ndarray:
    """torchvision's RandomCrop(W, padding=p) then RandomHorizontalFlip() on a
    uint8 (C, H, W) image, for the crop whose top-left corner in the
    zero-padded image is (p + dy, p + dx) and flip f."""
    _, H, W = image.shape
    p = max(abs(dy), abs(dx))
    padded = np.pad(image, ((0, 0), (p, p), (p, p)))
    out = padded[:, p + dy:p + dy + H, p + dx:p + dx + W]
    return out[:, :, ::-1] if f else out


# ----------------------------------------------------- whole-model checks


def assert_gradient_matches_float64_differences(model, params: np.ndarray, x: np.ndarray,
                                                y: np.ndarray, rng: np.random.Generator) -> None:
    """model.loss_and_grad's float32 gradient of the trained tensors against
    central differences of the network's own float64 specialisation (its ops
    compiled for float64, through the op signature), 4 entries a tensor;
    within 1e-4 of the difference (or of 1e-2). Running statistics are no
    gradient (they hold the batch's statistics) and are skipped."""
    from iasgd.nn import models, network, ops

    _, grad = model.loss_and_grad(params, x, y)
    ws = model.workspace(x.shape[0])
    acts, dacts = np.zeros(ws.acts_size), np.zeros(ws.acts_size)
    g64 = np.zeros(model.num_params)
    net64 = ops.network(ws.plan, ws.slice_size, np.float64)

    def loss64(p: np.ndarray) -> float:
        acts[: x.size] = (x.ravel() - models.INPUT_MEAN) / models.INPUT_STD
        return network.network_loss_and_grad(p, g64, net64, acts, dacts, ws.argmax, y, 0.0)

    p64 = params.astype(np.float64)
    for name, shape, off in model.layout:
        if off >= model.num_trained:
            continue
        size = int(np.prod(shape))
        for j in rng.choice(size, min(4, size), replace=False):
            fd = central_difference(loss64, p64, off + j, eps=1e-6)
            assert abs(fd - grad[off + j]) <= 1e-4 * max(abs(fd), 1e-2), name


def torch_reference():
    """torch and bench/torch_reference.py's torch_net, torch_inputs and
    torch_flat_params, torch on one thread; skips the test without torch
    (the `compare` extra)."""
    import sys
    from pathlib import Path

    import pytest

    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from torch_reference import torch_flat_params, torch_inputs, torch_net

    torch.set_num_threads(1)
    return torch, torch_net, torch_inputs, torch_flat_params


def assert_sgd_steps_match_torch(model, *, lr: float, momentum: float, weight_decay: float = 0.0,
                                 steps: int = 20, b: int = 8, tol: float = 1e-5):
    """`steps` steps of network.train_steps against PyTorch's SGD (the same
    lr, momentum and weight decay, train mode) on the same random CIFAR-10-
    shaped batches from model.init(0): each loss within tol, then every
    parameter and running statistic within tol (float32 sums in another
    order). Returns (params, net) after the steps."""
    from iasgd.nn import network
    from iasgd.nn import plan as P

    torch, torch_net, torch_inputs, torch_flat_params = torch_reference()
    params = model.init(0)
    net = torch_net(model, params).train()
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (steps * b, 3, 32, 32), dtype=np.uint8)
    labels = rng.integers(0, 10, steps * b)
    losses = np.zeros(steps)
    sgd = P.plain_sgd(lr, momentum, model.num_trained)._replace(weight_decay=weight_decay)
    network.train_steps(P.Weights(params, np.zeros_like(params)), model.workspace(b).buffers,
                        P.Images(images.reshape(steps * b, -1), labels, *model.image_transform),
                        P.Steps(np.arange(steps * b), 0, steps, b, sgd, 0), losses, None,
                        P.knobs_argument(sgd, params.size))
    for s in range(steps):
        batch = slice(s * b, (s + 1) * b)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(torch_inputs(images[batch])),
                                                 torch.from_numpy(labels[batch]))
        loss.backward()
        opt.step()
        assert abs(losses[s] - loss.item()) <= tol, s
    np.testing.assert_allclose(params, torch_flat_params(net), atol=tol)
    return params, net


def assert_export_computes_the_same_logits(model, params: np.ndarray, module_type: str,
                                           attribute: str) -> None:
    """iasgd.export.torch_module(model), loaded strictly with params, holds a
    torch.nn.<module_type> at `attribute` and computes model.logits' logits
    on 4 random inputs (within 1e-4 relative, 1e-5 absolute)."""
    import pytest

    torch = pytest.importorskip("torch")
    from iasgd.export import torch_module
    from iasgd.nn import models

    net = torch_module(model)
    assert isinstance(getattr(net, attribute), getattr(torch.nn, module_type))
    net.load_state_dict({name: torch.from_numpy(t.copy())
                         for name, t in model.tensors(params).items()}, strict=True)
    x = np.random.default_rng(3).random((4, *model.input_shape)).astype(np.float32)
    with torch.no_grad():
        want = net((torch.from_numpy(x) - models.INPUT_MEAN) / models.INPUT_STD).numpy()
    np.testing.assert_allclose(model.logits(params, x), want, rtol=1e-4, atol=1e-5)
