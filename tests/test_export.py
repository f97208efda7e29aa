"""Exported weights (python -m iasgd.export): every format holds every tensor
bit-exactly with the spec, PyTorch rebuilds the network from that spec and
predicts what iasgd predicts, load_weights reads them back bit-exactly and
names the first mismatch, and bad input is one line and exit 2.

Cases: LeNet-5 trained for one epoch by the command line (the configuration a
real run records), LeNet-5 sized for Fashion-MNIST, an MLP with --hidden,
vgg-small and a random layer spec on an odd input shape (checkpoints of
initial parameters: the forward pass is what is checked). The torch and
safetensors parts skip where those are not installed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from iasgd import checkpoints, export, run
from iasgd import data as datasets
from iasgd.export import ExportError, load_weights
from iasgd.nn import models
from iasgd.results import Snapshot

REPO = Path(__file__).resolve().parents[1]
FORMATS = (".pt", ".safetensors", ".npz")
# iasgd's float32 kernels against torch's float32 ops: the same sums in
# another order, over at most 4096 terms (vgg-small's fc1) of logits of O(1)
LOGITS_ATOL = 1e-4
N_IMAGES = 64


def random_spec(seed: int) -> str:
    """A random small layer spec that builds on RANDOM_SHAPE: conv blocks (odd
    kernels up to 5, either padding, optional ReLU and pool), an optional
    flatten, up to two hidden dense layers (optional ReLU), the output layer."""
    rng = np.random.default_rng(seed)
    while True:
        layers = []
        for _ in range(rng.integers(1, 4)):
            k, pad = rng.choice([1, 3, 5]), rng.choice(["s", "v"])
            layers.append(f"conv{rng.integers(1, 6)}k{k}{pad}")
            layers += ["relu"] * int(rng.integers(2)) + ["pool"] * int(rng.integers(2))
        layers += ["flatten"] * int(rng.integers(2))
        for _ in range(rng.integers(0, 3)):
            layers += [f"dense{rng.integers(1, 10)}"] + ["relu"] * int(rng.integers(2))
        spec = ",".join([*layers, "dense"])
        try:
            models.build(spec, None, input_shape=RANDOM_SHAPE, num_classes=RANDOM_CLASSES)
            return spec
        except ValueError:
            continue


RANDOM_SHAPE, RANDOM_CLASSES = (2, 11, 9), 4
# what each run's configuration says about its model, as python -m iasgd.run records it
# ("lenet" is a real run's); input_shape / num_classes stand in for a dataset; seed 18
# draws conv4k3s,relu,conv5k3s,relu,pool,conv4k3v,relu,pool,flatten,dense4,dense
CONFIGS = {
    "lenet": None,
    "lenet-fashion": {"model": "lenet", "dataset": "fashion-mnist", "hidden": None},
    "mlp": {"model": "mlp", "dataset": "synthetic", "hidden": [32, 16]},
    "vgg-small": {"model": "vgg-small", "dataset": "synthetic", "hidden": None},
    "random-spec": {"model": random_spec(18), "input_shape": list(RANDOM_SHAPE),
                    "num_classes": RANDOM_CLASSES},
}


class Case:
    """A checkpoint, the model and parameters in it, and test images (uint8)."""

    def __init__(self, path: Path, images: np.ndarray):
        self.path = path
        self.model, self.params, self.config = export.checkpoint_model(path)
        self.images = images


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict[str, Case]:
    root = tmp_path_factory.mktemp("checkpoints")
    out = root / "lenet.json"  # a real run: the checkpoint lands beside it as lenet.ckpt.h5
    assert run.main(["--dataset", "synthetic", "--epochs", "1", "--quiet", "--out", str(out)]) == 0
    found = {"lenet": Case(root / "lenet.ckpt.h5", datasets.load("synthetic").x_test[:N_IMAGES])}
    for i, (name, config) in enumerate(CONFIGS.items()):
        if config is None:
            continue
        model = models.build(config["model"], config.get("dataset"),
                             input_shape=config.get("input_shape"),
                             num_classes=config.get("num_classes"),
                             hidden=tuple(config["hidden"]) if config.get("hidden") else None)
        path = root / f"{name}.ckpt.h5"
        checkpoints.save(path, config, Snapshot({"params": model.init(i)}, {}))
        images = datasets.synthetic(i, 1, N_IMAGES, model.input_shape, model.num_classes).x_test
        found[name] = Case(path, images)
    return found


def exported(case: Case, suffix: str, tmp_path: Path) -> Path:
    if suffix == ".pt":
        pytest.importorskip("torch")
    elif suffix == ".safetensors":
        pytest.importorskip("safetensors")
    to = tmp_path / f"model{suffix}"
    assert export.main([str(case.path), "--to", str(to)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [to.name]  # no temporary left
    return to


def read_with_its_own_tool(path: Path) -> tuple[dict[str, np.ndarray], dict]:
    """The tensors and metadata as the format's own reader gives them, not iasgd's."""
    if path.suffix == ".pt":
        import torch

        saved = torch.load(path, weights_only=True)
        assert set(saved) == {"state_dict", "metadata"}
        return {k: v.numpy() for k, v in saved["state_dict"].items()}, saved["metadata"]
    if path.suffix == ".safetensors":
        from safetensors import safe_open
        from safetensors.numpy import load_file

        with safe_open(str(path), framework="np") as f:
            raw = f.metadata()
        meta = {k: v if k in ("format", "model", "spec", "dataset") else json.loads(v)
                for k, v in raw.items()}
        return load_file(str(path)), meta
    with np.load(path, allow_pickle=False) as f:
        meta = json.loads(str(f["__iasgd_spec__"]))
        return {k: f[k] for k in f.files if k != "__iasgd_spec__"}, meta


@pytest.mark.parametrize("suffix", FORMATS)
@pytest.mark.parametrize("name", CONFIGS)
def test_export_holds_every_tensor_and_the_spec(cases, name, suffix, tmp_path):
    case = cases[name]
    model, params = case.model, case.params
    tensors, meta = read_with_its_own_tool(exported(case, suffix, tmp_path))
    want = model.tensors(params)
    assert sorted(tensors) == sorted(want) and meta["tensors"] == list(want)  # layout order
    for key, t in want.items():
        assert tensors[key].dtype == np.float32 and tensors[key].shape == t.shape
        assert tensors[key].tobytes() == t.tobytes(), key
    scale, shift = model.image_transform
    assert meta == {"format": "iasgd-weights", "version": 1, "model": model.name,
                    "spec": model.spec, "input_shape": list(model.input_shape),
                    "num_classes": model.num_classes, "input_scale": scale,
                    "input_shift": shift, "tensors": list(want),
                    **({"dataset": case.config["dataset"]} if "dataset" in case.config
                       else {})}
    # and back into iasgd, bit for bit
    assert load_weights(tmp_path / f"model{suffix}", model).tobytes() == params.tobytes()


@pytest.mark.parametrize("suffix", FORMATS)
@pytest.mark.parametrize("name", CONFIGS)
def test_pytorch_rebuilds_the_network_and_predicts_like_iasgd(cases, name, suffix, tmp_path):
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    case = cases[name]
    model, params, images = case.model, case.params, case.images
    path = exported(case, suffix, tmp_path)
    tensors, meta = read_with_its_own_tool(path)
    net = export.torch_module(meta)  # from the recorded spec alone
    net.load_state_dict({k: torch.from_numpy(v) for k, v in tensors.items()}, strict=True)
    net.eval()
    x = torch.from_numpy(images).float() * meta["input_scale"] + meta["input_shift"]
    with torch.no_grad():
        theirs = net(x).numpy()
    ours = model.logits(params, images.astype(np.float32) / 255)
    np.testing.assert_allclose(theirs, ours, rtol=0, atol=LOGITS_ATOL)
    # The same predictions, except where the top two logits are closer than the
    # two sides may differ (a tie either side may break); nearly no sample is.
    predicted = model.predict_images(params, images)
    top2 = np.sort(ours, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 2 * LOGITS_ATOL
    assert clear.mean() > 0.9
    np.testing.assert_array_equal(theirs.argmax(1)[clear], predicted[clear])
    if name == "lenet":  # trained: it has learned the synthetic classes
        labels = datasets.load("synthetic").y_test[:N_IMAGES]
        assert (theirs.argmax(1) == labels).mean() > 0.8
    with torch.no_grad():  # load_torch: the same network in one call
        assert torch.equal(export.load_torch(path)(x), net(x))


def test_the_docs_snippet_runs(cases, tmp_path, monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    text = (REPO / "docs" / "models.md").read_text()
    section = text.split("## Taking a trained model out", 1)[1]
    snippet = re.search(r"```python\n(.*?)```", section, re.S)[1]
    exported(cases["lenet"], ".pt", tmp_path)
    capsys.readouterr()  # the export's own line
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    scope: dict = {}
    exec(compile(snippet, "docs/models.md", "exec"), scope)
    assert scope["logits"].shape == (4, 10)
    images = scope["images"].numpy()
    want = cases["lenet"].model.predict_images(cases["lenet"].params, images)
    assert capsys.readouterr().out.strip() == str(torch.from_numpy(want))


# ------------------------------------------------------------------ load_weights


def write_npz(path: Path, tensors: dict[str, np.ndarray], meta: dict | None) -> Path:
    extra = {} if meta is None else {"__iasgd_spec__": np.array(json.dumps(meta))}
    np.savez(path, **tensors, **extra)
    return path


def lenet_weights(cases) -> tuple[models.Model, dict[str, np.ndarray], dict]:
    model = cases["lenet"].model
    tensors = {k: v.copy() for k, v in model.tensors(cases["lenet"].params).items()}
    return model, tensors, export.weights_metadata(model, "synthetic")


def one_line_error(call) -> str:
    with pytest.raises(ExportError) as e:
        call()
    message = str(e.value)
    assert "\n" not in message
    return message


def test_load_weights_names_the_first_mismatch(cases, tmp_path):
    model, tensors, meta = lenet_weights(cases)
    shape = dict(tensors, **{"conv2.weight": tensors["conv2.weight"][:, :5]})
    missing = {k: v for k, v in tensors.items() if k != "conv2.bias"}
    extra = dict(tensors, **{"fc3.weight": np.zeros((2, 2), np.float32)})
    nan = dict(tensors, **{"fc1.bias": np.full(120, np.nan, np.float32)})
    ints = dict(tensors, **{"fc2.bias": np.zeros(10, np.int32)})
    cases_ = {
        "shape": (shape, "conv2.weight has shape (16, 5, 5, 5), the model's is (16, 6, 5, 5)"),
        "missing": (missing, "has no tensor conv2.bias (16)"),
        "extra": (extra, "has a tensor fc3.weight that"),
        "nan": (nan, "fc1.bias holds NaN or infinite values"),
        "ints": (ints, "fc2.bias is int32, not floating point"),
    }
    for what, (bad, says) in cases_.items():
        path = write_npz(tmp_path / f"{what}.npz", bad, meta)
        assert says in one_line_error(lambda p=path: load_weights(p, model)), what


def test_load_weights_refuses_another_network_with_the_same_shapes(cases, tmp_path):
    model, tensors, meta = lenet_weights(cases)
    # the first ReLU dropped: every tensor keeps its name and shape, the function changes
    other = models.build("conv6k5v,pool,conv16k5v,relu,pool,dense120,relu,dense", "synthetic")
    path = write_npz(tmp_path / "w.npz", tensors, meta)
    message = one_line_error(lambda: load_weights(path, other))
    assert message.endswith(f"holds weights of {model.spec}, not of {other.spec}")
    assert load_weights(path, other, check_spec=False).tobytes() == \
        cases["lenet"].params.tobytes()
    # the same network fed differently normalised inputs is another function too
    shifted = write_npz(tmp_path / "shifted.npz", tensors, dict(meta, input_shift=0.0))
    assert "was trained on inputs pixels * " in one_line_error(lambda: load_weights(shifted, model))
    # weights without metadata (a plain state dict) are checked by names and shapes alone
    plain = write_npz(tmp_path / "plain.npz", tensors, None)
    assert load_weights(plain, model).tobytes() == cases["lenet"].params.tobytes()
    # another model altogether: the spec, or without that check the first missing tensor
    mlp = cases["mlp"].model
    assert "not of dense32" in one_line_error(lambda: load_weights(path, mlp))
    assert "fc1.weight has shape (120, 400), the model's is (32, 3072)" in one_line_error(
        lambda: load_weights(path, mlp, check_spec=False))


def test_load_weights_reads_a_checkpoint_and_float64(cases, tmp_path):
    model, tensors, meta = lenet_weights(cases)
    params = cases["lenet"].params
    assert load_weights(cases["lenet"].path, model).tobytes() == params.tobytes()
    wide = write_npz(tmp_path / "w.npz", {k: v.astype(np.float64) for k, v in tensors.items()},
                     meta)
    assert load_weights(wide, model).tobytes() == params.tobytes()  # float32 -> 64 -> 32


@pytest.mark.parametrize(("name", "content", "says"), [
    ("w.npz", b"not a zip", "is not an .npz archive of tensors"),
    ("p.npz", b"\x80\x04\x95" + b"\x00" * 20, "is not an .npz archive of tensors"),
    ("w.safetensors", b"\x08\x00\x00\x00\x00\x00\x00\x00{}", "cannot read"),
    ("w.onnx", b"", "unknown format .onnx"),
    ("w.h5", b"text", "not an iasgd checkpoint"),
])
def test_load_weights_bad_files_are_one_line(cases, tmp_path, name, content, says):
    if name.endswith(".safetensors"):
        pytest.importorskip("safetensors")
    path = tmp_path / name
    path.write_bytes(content)
    message = one_line_error(lambda: load_weights(path, cases["lenet"].model))
    assert says in message and "allow_pickle" not in message, message  # issue 41, item 4a
    assert "does not exist" in one_line_error(
        lambda: load_weights(tmp_path / "none.npz", cases["lenet"].model))


# ------------------------------------------------------------------ the command line


@pytest.fixture(scope="module")
def bad_inputs(cases, tmp_path_factory) -> dict[str, tuple[int, str, str, Path]]:
    """python -m iasgd.export on bad input, all started at once (each process
    spends most of its time importing numba): name -> (rc, stdout, stderr, dir)."""
    root = tmp_path_factory.mktemp("bad")
    good = str(cases["lenet"].path)
    argvs = {
        "missing": ["none.ckpt.h5", "--to", "m.npz"],
        "not hdf5": ["text.h5", "--to", "m.npz"],
        "unknown suffix": [good, "--to", "m.onnx"],
        "no --to": [good],
    }
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = {}
    for i, (what, argv) in enumerate(argvs.items()):
        cwd = root / f"run{i}"
        cwd.mkdir()
        (cwd / "text.h5").write_text("not a checkpoint")
        procs[what] = (subprocess.Popen([sys.executable, "-m", "iasgd.export", *argv],
                                        cwd=cwd, env=env, text=True, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE), cwd)
    return {what: (p.wait(timeout=300), *p.communicate(), cwd) for what, (p, cwd) in procs.items()}


@pytest.mark.parametrize(("what", "says"), [
    ("missing", "checkpoint none.ckpt.h5 does not exist"),
    ("not hdf5", "text.h5 is not an iasgd checkpoint (not an HDF5 file)"),
    ("unknown suffix", "--to m.onnx: unknown format .onnx; use .pt, .safetensors or .npz"),
    ("no --to", "the following arguments are required: --to"),
])
def test_bad_input_is_one_line_and_exit_2(bad_inputs, what, says):
    rc, out, err, cwd = bad_inputs[what]
    assert rc == 2, err
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("iasgd: error: "), err
    assert says in err
    assert sorted(p.name for p in cwd.iterdir()) == ["text.h5"]  # nothing written


@pytest.mark.parametrize(("what", "says"), [
    ("not a checkpoint", "other.h5 is not an iasgd checkpoint"),
    ("no model", "nomodel.h5 does not name its model"),
    ("no params", "noparams.h5 holds no parameters"),
    ("other params", "do not fit lenet (52,202 float32)"),
    ("no directory", "directory"),
])
def test_more_bad_input_is_one_line_and_exit_2(cases, tmp_path, capsys, what, says):
    """The same in this process (main, as python -m iasgd.export runs it)."""
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f["x"] = 1
    params = cases["lenet"].params
    checkpoints.save(tmp_path / "nomodel.h5", {}, Snapshot({"params": params}, {}))
    config = cases["lenet"].config
    checkpoints.save(tmp_path / "noparams.h5", config, Snapshot({}, {}))
    checkpoints.save(tmp_path / "short.h5", config, Snapshot({"params": params[:-1]}, {}))
    before = sorted(p.name for p in tmp_path.iterdir())
    argv = {"not a checkpoint": ["other.h5", "m.npz"], "no model": ["nomodel.h5", "m.npz"],
            "no params": ["noparams.h5", "m.npz"], "other params": ["short.h5", "m.npz"],
            "no directory": [str(cases["lenet"].path), "nowhere/m.npz"]}[what]
    assert export.main([str(tmp_path / argv[0]), "--to", str(tmp_path / argv[1])]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith("iasgd: error: ")
    assert says in captured.err, captured.err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_diverged_run_is_not_exported(cases, tmp_path, capsys):
    params = cases["lenet"].params.copy()
    params[7] = np.nan
    checkpoints.save(tmp_path / "c.h5", cases["lenet"].config, Snapshot({"params": params}, {}))
    assert export.main([str(tmp_path / "c.h5"), "--to", str(tmp_path / "m.npz")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "NaN or infinite values (the run diverged)" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.h5"]


def test_the_safetensors_string_map_rebuilds_the_network(cases, tmp_path):
    safetensors = pytest.importorskip("safetensors")
    pytest.importorskip("torch")
    path = exported(cases["random-spec"], ".safetensors", tmp_path)
    with safetensors.safe_open(str(path), framework="np") as f:
        raw = f.metadata()
    assert all(isinstance(v, str) for v in raw.values())
    net = export.torch_module(raw)
    assert [n for n, _ in net.named_parameters()] == json.loads(raw["tensors"])


@pytest.mark.parametrize(("suffix", "blocked", "install"), [
    (".pt", "torch", "pip install torch --index-url https://download.pytorch.org/whl/cpu"),
    (".safetensors", "safetensors", "pip install safetensors"),
])
def test_a_missing_package_says_what_to_install(cases, tmp_path, monkeypatch, capsys,
                                                suffix, blocked, install):
    for name in [m for m in sys.modules if m == blocked or m.startswith(blocked + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, blocked, None)  # import fails, installed or not
    to = tmp_path / f"model{suffix}"
    to.write_bytes(b"the previous export")
    assert export.main([str(cases["lenet"].path), "--to", str(to)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.rstrip().endswith(install), err
    assert to.read_bytes() == b"the previous export"  # untouched, and no temporary left
    assert [p.name for p in tmp_path.iterdir()] == [to.name]
    # the other formats do not need it (npz: numpy only)
    assert export.main([str(cases["lenet"].path), "--to", str(tmp_path / "m.npz")]) == 0


def test_a_missing_torch_names_its_cpu_build(monkeypatch):
    def no_torch(name):
        raise ImportError(name)

    monkeypatch.setattr(export.importlib, "import_module", no_torch)
    with pytest.raises(export.ExportError) as missing:
        export._require("torch", "a .pt file")
    assert str(missing.value).endswith(
        "pip install torch --index-url https://download.pytorch.org/whl/cpu")
