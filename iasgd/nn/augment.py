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


def augment_argument(data: Images) -> bool | None:
    """network.train_steps' and the worker steps' `augment`
    (iasgd.protocol.workers) for the Images bundle `data`: True where it
    asks for augmentation, else None. numba drops a branch on `augment is not
    None` before it types the function when the argument is None, so steps
    without augmentation never compile it: 2-2.4 s less of the steps'
    compile, the longest job of a cold start (docs/performance.md)."""
    return True if data.pad > 0 or data.flip else None


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

    Unflipped, the output rows of a plane that have a source row are one
    contiguous run of the source's values offset by dy * W + dx: they are
    copied as one long loop (which LLVM vectorises, like the plain gather),
    then the columns whose source lies left or right of the image are
    padded. Flipped, each row is read backwards into place. Slices of the
    arrays and unsigned indices keep the loops' indices provably
    non-negative (numba's negative-index wraparound would stop LLVM from
    vectorising them).
    """
    a = np.float32(scale)
    c = np.float32(shift)
    pad_value = np.float32(0) * a + c  # a uint8 0, transformed
    C, H, W = shape
    HW = H * W
    for i in range(idx.size):
        src = images[idx[i]]
        dst = x[i]
        dy, dx, f = codes[i, 0], codes[i, 1], codes[i, 2]
        y0, y1 = max(0, -dy), min(H, H - dy)  # the output rows with a source row
        lo, hi = max(0, -dx), min(W, W - dx)  # the columns with a source column
        if y0 >= y1 or lo >= hi:  # shifted off the image (pad >= H or W)
            _fill(dst, 0, C * HW, pad_value)
            continue
        first, last = y0 * W + lo, (y1 - 1) * W + hi  # the run, in a plane
        offset = dy * W + dx
        for p in range(0, C * HW, HW):
            _fill(dst, p, p + y0 * W, pad_value)
            _fill(dst, p + y1 * W, p + HW, pad_value)
            if f:  # row by row, each read backwards: out column x is W-1-x's
                m = hi - lo
                for r in range(p + y0 * W, p + y1 * W, W):
                    _fill(dst, r, r + W - hi, pad_value)
                    _fill(dst, r + W - lo, r + W, pad_value)
                    d = dst[r + W - hi:r + W - lo]
                    s = src[r + lo + offset:r + hi + offset]
                    for k in range(m):
                        d[k] = s[np.uint64(m - 1 - k)] * a + c
                continue
            d = dst[p + first:p + last]
            s = src[p + first + offset:p + last + offset]
            for k in range(last - first):
                d[k] = s[k] * a + c
            for r in range(p + y0 * W, p + y1 * W, W):
                _fill(dst, r, r + lo, pad_value)
                _fill(dst, r + hi, r + W, pad_value)


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
