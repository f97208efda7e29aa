"""Augmentation in the compiled batch gather (iasgd.nn.augment): the crop and
flip against a numpy reference of torchvision's RandomCrop(padding) +
RandomHorizontalFlip for given codes, the codes' stream and distribution,
the sequential steps and a worker's batch drawing them as documented."""

from __future__ import annotations

import numpy as np
import pytest
from reference import augment_codes, pad_crop_flip, splitmix64, step_stream

from iasgd.nn import augment as A
from iasgd.nn import models
from iasgd.nn import network as N
from iasgd.nn import plan as P
from iasgd.protocol import workers as W

SHAPE = (2, 5, 7)
SCALE, SHIFT = 1 / (255 * 0.25), -0.5 / 0.25  # any transform with a shift: pads show it


def gathered(images: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """The plain gather of (M, D) uint8 rows (the kernel every run used before
    augmentation), as float32."""
    x = np.zeros((idx.size, images.shape[1]), np.float32)
    N.gather_images(images, idx, SCALE, SHIFT, x)
    return x


def reference(images: np.ndarray, idx: np.ndarray, codes: np.ndarray,
              shape: tuple[int, int, int]) -> np.ndarray:
    """The rows idx of images padded, cropped and flipped by codes in uint8."""
    return np.stack([pad_crop_flip(images[i].reshape(shape), *codes[k]).reshape(-1)
                     for k, i in enumerate(idx)])


def augmented(images, idx, codes, shape=SHAPE, spare=1):
    """gather_augmented into an array with `spare` guard rows after the batch
    (NaN: a write past the batch shows)."""
    x = np.full((idx.size + spare, images.shape[1]), np.nan, np.float32)
    A.gather_augmented(images, idx, codes, shape, SCALE, SHIFT, x[:idx.size])
    assert np.isnan(x[idx.size:]).all()
    return x[:idx.size]


def every_code(pad: int) -> np.ndarray:
    return np.array([(dy, dx, f) for dy in range(-pad, pad + 1) for dx in range(-pad, pad + 1)
                     for f in (0, 1)], np.int64)


@pytest.mark.parametrize("pad", [1, 3, 9])  # 9: beyond the image, rows and columns of padding
def test_the_gather_is_pad_crop_flip_then_the_transform_for_every_code(pad):
    rng = np.random.default_rng(pad)
    images = rng.integers(1, 256, (5, np.prod(SHAPE)), dtype=np.uint8)  # no 0: pads show
    codes = every_code(pad)
    idx = rng.integers(0, 5, codes.shape[0])
    want = reference(images, idx, codes, SHAPE)
    got = augmented(images, idx, codes)
    # bit for bit what the plain gather makes of the augmented uint8 images: a
    # padded pixel is a transformed uint8 0, i.e. SHIFT
    assert got.tobytes() == gathered(want, np.arange(idx.size)).tobytes()
    np.testing.assert_allclose(got, want * np.float32(SCALE) + np.float32(SHIFT), rtol=1e-6,
                               atol=1e-6)
    assert (got == np.float32(SHIFT)).any() and (want == 0).any()


def test_code_zero_is_the_plain_gather_bit_for_bit():
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (6, 3 * 32 * 32), dtype=np.uint8)
    idx = np.array([5, 0, 0, 3])
    got = augmented(images, idx, np.zeros((4, 3), np.int64), (3, 32, 32))
    assert got.tobytes() == gathered(images, idx).tobytes()


def test_a_flip_mirrors_and_a_shift_moves_the_image():
    image = np.arange(1, 36, dtype=np.uint8).reshape(1, 5, 7)
    flat = image.reshape(1, -1)
    (flipped,) = augmented(flat, np.array([0]), np.array([[0, 0, 1]]), (1, 5, 7))
    np.testing.assert_array_equal(flipped.reshape(5, 7), gathered(flat, np.array([0]))
                                  .reshape(5, 7)[:, ::-1])
    (moved,) = augmented(flat, np.array([0]), np.array([[1, -2, 0]]), (1, 5, 7))
    moved = ((moved.reshape(5, 7) - np.float32(SHIFT)) / np.float32(SCALE)).round()
    # out[y, x] = in[y + 1, x - 2]: the image moves up one row and right two columns
    np.testing.assert_array_equal(moved[:4, 2:], image[0, 1:, :5])
    assert (moved[4] == 0).all() and (moved[:, :2] == 0).all()


# ---------------------------------------------------------------- the codes


@pytest.mark.parametrize(("pad", "flip"), [(4, True), (2, False), (0, True)])
def test_codes_are_the_documented_draws_of_the_stream(pad, flip):
    state = 0x1234_5678_9ABC_DEF0
    rng = np.array([state], np.uint64)
    codes = np.full((50, 3), 99, np.int64)
    A.draw_codes(codes, 40, pad, flip, rng)
    after, want = augment_codes(state, 40, pad, flip)
    np.testing.assert_array_equal(codes[:40], want)
    assert int(rng[0]) == after  # exactly (2 if pad else 0) + flip draws a sample
    assert (codes[40:] == 99).all()


def test_codes_cover_every_shift_and_both_flips_uniformly():
    pad, n = 3, 14000
    codes = np.zeros((n, 3), np.int64)
    A.draw_codes(codes, n, pad, True, np.array([7], np.uint64))
    for column, k in ((0, 2 * pad + 1), (1, 2 * pad + 1), (2, 2)):
        values = codes[:, column] + (pad if column < 2 else 0)
        counts = np.bincount(values, minlength=k)
        assert counts.size == k and counts.min() > 0
        assert np.abs(counts / n - 1 / k).max() < 0.02
    # dy, dx and f independent: every one of the 98 codes occurs
    assert len({tuple(c) for c in codes}) == (2 * pad + 1) ** 2 * 2


def test_a_stream_fixes_its_codes_and_another_stream_differs():
    def draw(state):
        codes = np.zeros((16, 3), np.int64)
        A.draw_codes(codes, 16, 4, True, np.array([state], np.uint64))
        return codes

    assert (draw(11) == draw(11)).all()
    assert (draw(11) != draw(12)).any()


def test_a_step_stream_depends_on_the_epoch_seed_and_the_step_only():
    rng = np.array([5], np.uint64)
    A.seed_step(rng, np.uint64(2**63 + 9), 17)
    assert int(rng[0]) == step_stream(2**63 + 9, 17)
    firsts = set()
    for step in range(200):
        A.seed_step(rng, np.uint64(3), step)
        firsts.add(int(rng[0]))
    assert len(firsts) == 200


# ------------------------------------------------- where the codes are drawn


def test_augmented_sequential_steps_train_on_the_reference_images():
    """train_steps with --augment crop,flip (pad 2) is, to the bit, train_steps
    without augmentation on the images augmented in numpy with the codes of
    each step's stream (seeded by the epoch's seed and the step)."""
    model = models.build("mlp", input_shape=SHAPE, num_classes=3, hidden=(6,))
    rng = np.random.default_rng(0)
    b, steps = 4, 6
    images = rng.integers(0, 256, (b * steps, int(np.prod(SHAPE))), dtype=np.uint8)
    labels = rng.integers(0, 3, b * steps)
    order = rng.permutation(b * steps).astype(np.int64)
    base = np.uint64(0xDEAD_BEEF_0000_0042)

    def train(data, order, aug_seed):
        params = model.init(1)
        weights = P.Weights(params, np.zeros_like(params))
        losses = np.zeros(steps)
        N.train_steps(weights, model.workspace(b).buffers, data,
                      P.Steps(order, 0, steps, b, P.plain_sgd(0.1, 0.5), 0, aug_seed), losses,
                      A.augment_argument(data), None)
        return params, losses

    on = A.image_inputs(images, labels, (SCALE, SHIFT), SHAPE, "crop,flip", 2)
    got, got_losses = train(on, order, base)
    rows = []
    for s in range(steps):
        _, codes = augment_codes(step_stream(int(base), s), b, 2, True)
        rows.append(reference(images, order[s * b:(s + 1) * b], codes, SHAPE))
    off = A.image_inputs(np.concatenate(rows), labels[order], (SCALE, SHIFT), SHAPE)
    want, want_losses = train(off, np.arange(b * steps, dtype=np.int64), np.uint64(0))
    assert got.tobytes() == want.tobytes()
    assert got_losses.tobytes() == want_losses.tobytes()
    plain, _ = train(A.image_inputs(images, labels, (SCALE, SHIFT), SHAPE), order, base)
    assert plain.tobytes() != got.tobytes()


@pytest.mark.parametrize("augment", ["none", "crop,flip"])
def test_a_worker_draws_its_codes_after_its_batch_from_its_stream(augment):
    """W.draw_step_batch (the threads' and the simulator's draw): the batch's
    indices as before, then (augmenting) the codes from the same stream; off,
    the stream moves exactly as the batch's draw moves it."""
    model = models.build("mlp", input_shape=SHAPE, num_classes=3, hidden=(6,))
    images = np.random.default_rng(2).integers(0, 256, (30, int(np.prod(SHAPE))), np.uint8)
    inputs = A.image_inputs(images, np.zeros(30, np.int64), (SCALE, SHIFT), SHAPE, augment, 3)
    ws = model.workspace(5)
    own = W.new_own(ws, np.zeros(1, np.float32), np.zeros(W.COUNTER_COLUMNS, np.int64),
                    np.zeros(4, np.int64), np.zeros(1), np.array([99], np.uint64))
    flag = A.augment_argument(inputs)
    assert (flag is None) == (augment == "none")
    W.draw_step_batch(inputs, own, flag)
    state, idx = 99, []
    for _ in range(5):
        state, z = splitmix64(state)
        idx.append(z % 30)
    np.testing.assert_array_equal(own.idx, idx)
    if augment == "none":
        assert int(own.rng[0]) == state and not own.codes.any()
    else:
        after, codes = augment_codes(state, 5, 3, True)
        np.testing.assert_array_equal(own.codes, codes)
        assert int(own.rng[0]) == after
    W.gather_batch(inputs, own, flag)
    want = reference(images, own.idx, own.codes, SHAPE) if augment != "none" else images[idx]
    assert ws.acts[:want.size].tobytes() == gathered(want, np.arange(5)).tobytes()


def test_image_inputs_types_do_not_depend_on_augment():
    """One compilation serves every --augment: the bundle's field types agree."""
    import numba

    kinds = {str(numba.typeof(A.image_inputs(np.zeros((2, 70), np.uint8), np.zeros(2, np.int64),
                                             (0.1, -1.0), SHAPE, augment, 4)))
             for augment in A.AUGMENTS}
    assert len(kinds) == 1
