"""Data augmentation in the compiled batch gather (--augment, --crop-padding).

torchvision's `RandomCrop(W, padding=pad)` (zero padding) followed by
`RandomHorizontalFlip()`, applied to each sample's uint8 image (C, H, W)
while the batch is gathered and transformed (`images * scale + shift`):

    out[c, y, x] = img[c, y + dy, x' + dx] * scale + shift,  x' = W-1-x if flip else x

with the pixels from outside the image 0 in uint8, i.e. `0 * scale + shift`
after the transform, as torchvision pads with 0 before ToTensor/Normalize.
A sample's *code* is (dy, dx, flip): dy and dx uniform in [-pad, pad]
(torchvision's top and left corner of the crop in the padded image, minus
pad), flip 0 or 1 with probability 1/2.

The codes come from a splitmix64 stream (`next_random`), the one the
parallel workers draw their batches from: a worker draws a batch's codes
from its own stream right after the batch's indices
(iasgd.protocol.workers), so a seed fixes a run and the simulator draws
what the threads draw. The sequential executor draws step s's codes from a
stream seeded by (the run's seed, the epoch, s): `seed_step`. Nothing is
drawn, and the gather is network.gather_images, when augmentation is off.

Everything here is compiled and inlined into its callers (the training
steps and the worker loops): pure functions on preallocated arrays.
"""

from __future__ import annotations

import numpy as np

from iasgd.compiled import jit_inline
from iasgd.nn.plan import Images

# --augment's choices, and what each turns on: (crop, flip)
AUGMENTS = {"none": (False, False), "crop": (True, False), "flip": (False, True),
            "crop,flip": (True, True)}
CODES = 3  # columns of a sample's code: dy, dx, flip

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


@jit_inline
def next_random(rng):
    """The next value of the splitmix64 stream whose state is rng[0]. Each
    worker owns its stream, so its batches do not depend on which thread
    (or simulator) draws them."""
    rng[0] += _GOLDEN
    z = rng[0]
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


@jit_inline
def augmenting(data):
    """Whether the Images bundle `data` (iasgd.nn.plan) asks for augmentation."""
    return data.pad > 0 or data.flip


@jit_inline
def seed_step(rng, base, step):
    """rng[0] = the first state of step `step`'s stream: the splitmix64
    output at position step + 1 of the stream from `base` (uint64; the
    sequential executor's per-epoch seed), so every step's stream starts at
    a mixed, unrelated point."""
    rng[0] = base + _GOLDEN * np.uint64(step)
    rng[0] = next_random(rng)


@jit_inline
def draw_codes(codes, n, pad, flip, rng):
    """codes[i] = (dy, dx, f) for the first n rows of codes (b, CODES) int64,
    from the stream rng: dy then dx uniform in [-pad, pad] (pad > 0: one
    draw each; pad 0: 0, nothing drawn), then f in {0, 1} (flip: the top
    bit of one draw; otherwise 0, nothing drawn)."""
    k = np.uint64(2 * pad + 1)
    for i in range(n):
        if pad > 0:
            codes[i, 0] = np.int64(next_random(rng) % k) - pad
            codes[i, 1] = np.int64(next_random(rng) % k) - pad
        else:
            codes[i, 0] = 0
            codes[i, 1] = 0
        codes[i, 2] = np.int64(next_random(rng) >> np.uint64(63)) if flip else 0


@jit_inline
def _fill(dst, lo, hi, value):
    for k in range(lo, hi):
        dst[k] = value


@jit_inline
def gather_augmented(images, idx, codes, shape, scale, shift, x):
    """x[i] = images[idx[i]] shifted by codes[i]'s (dy, dx), flipped if its
    f, * scale + shift as float32 (the module doc's formula; outside the
    image: shift).

    images: (M, C*H*W) uint8; idx: (N,) rows; codes: (>= N, CODES) int64;
    shape: (C, H, W); x: (N, C*H*W) float32. With codes (0, 0, 0) a row is
    network.gather_images' bit for bit.
    """
    a = np.float32(scale)
    c = np.float32(shift)
    pad_value = np.float32(0) * a + c  # a uint8 0, transformed
    C, H, W = shape
    for i in range(idx.size):
        src = images[idx[i]]
        dst = x[i]
        dy, dx, f = codes[i, 0], codes[i, 1], codes[i, 2]
        # the output columns whose source column x' + dx lies in [0, W)
        lo = max(0, dx) if f else max(0, -dx)
        hi = min(W, W + dx) if f else min(W, W - dx)
        lo = min(lo, W)  # a shift beyond the image (pad >= W): no source column
        hi = max(hi, lo)
        for ch in range(C):
            for y in range(H):
                out = (ch * H + y) * W
                sy = y + dy
                if sy < 0 or sy >= H:
                    _fill(dst, out, out + W, pad_value)
                    continue
                _fill(dst, out, out + lo, pad_value)
                _fill(dst, out + hi, out + W, pad_value)
                row = (ch * H + sy) * W
                if f:
                    last = row + W - 1 + dx  # source of output column 0
                    for k in range(lo, hi):
                        dst[out + k] = src[last - k] * a + c
                else:
                    first = row + dx
                    for k in range(lo, hi):
                        dst[out + k] = src[first + k] * a + c


# ------------------------------------------------------- the bundle (Python)


def image_inputs(images: np.ndarray, labels: np.ndarray, transform: tuple[float, float],
                 shape: tuple[int, ...], augment: str = "none", crop_padding: int = 4) -> Images:
    """The Images bundle of training images (M, C*H*W) uint8 of `shape`
    (C, H, W) and their labels, transformed by (scale, shift), augmented as
    --augment says (a crop of `crop_padding`). Its fields are always of the
    same types, so one compilation serves every --augment."""
    crop, flip = AUGMENTS[augment]
    return Images(images, labels, float(transform[0]), float(transform[1]),
                  tuple(int(v) for v in shape), int(crop_padding) if crop else 0, bool(flip))
