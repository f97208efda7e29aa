"""A trained model out of iasgd, and weights back in.

`python -m iasgd.export CHECKPOINT --to model.pt|model.safetensors|model.npz`
reads a run's checkpoint, rebuilds its model from the saved configuration and
writes the parameters as named float32 tensors with PyTorch's names and shapes
(`conv1.weight` (out, in, k, k), `conv1.bias` (out,), ..., `fc1.weight`
(out, in), ...), together with what rebuilding the network takes (the
metadata, `weights_metadata`): the canonical spec string, the input shape
(C, H, W), the class count and the input normalisation (uint8 pixels
-> pixels * input_scale + input_shift).

The formats:

- `.pt`: `{"state_dict": {name: tensor}, "metadata": {...}}`, plain tensors,
  str, int, float and lists only, so `torch.load(path, weights_only=True)`
  reads it. Needs PyTorch to write and to read.
- `.safetensors`: the tensors, and the metadata as the file's string map
  (strings as they are, other values as JSON). Needs `safetensors` (not torch).
- `.npz`: one array per tensor, and `__iasgd_spec__`, a 0-d string array
  holding the metadata as JSON; `np.load(path, allow_pickle=False)` reads it.

Back in: `load_weights(path, model)` reads any of the three (or a checkpoint)
into iasgd's flat float32 parameter array, checked against the model;
`torch_module(metadata)` rebuilds the network as a `torch.nn.Sequential` whose
state dict the export fits with `load_state_dict(strict=True)`; `load_torch`
does both. docs/models.md, "Taking a trained model out", has an example.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, NoReturn

import h5py
import numpy as np

from iasgd import checkpoints, files
from iasgd.data.own import npz_problem
from iasgd.nn import models
from iasgd.nn.layers import kind_of
from iasgd.nn.models import Model

if TYPE_CHECKING:  # torch is optional: imported where a .pt or a torch module is asked for
    import torch

EXIT_USAGE = 2
FORMAT = "iasgd-weights"
VERSION = 1
NPZ_SPEC_KEY = "__iasgd_spec__"
FORMATS = (".pt", ".safetensors", ".npz")  # what --to writes
CHECKPOINT_SUFFIXES = (".h5", ".hdf5")  # what load_weights also reads
# Metadata values that are not strings, by key: safetensors keeps only strings,
# so these are written there as JSON and parsed back.
_JSON_KEYS = ("version", "input_shape", "num_classes", "input_scale", "input_shift", "tensors")


class ExportError(ValueError):
    """Weights that cannot be written or read; the message is one line."""


# ------------------------------------------------------------------ metadata


def weights_metadata(model: Model, dataset: str | None = None) -> dict[str, Any]:
    """What rebuilding `model` takes, as plain str/int/float/list values.

    format / version: "iasgd-weights", 1; model: the preset name or spec the
    run was given; spec: the canonical layer spec (`Model.spec`); input_shape:
    [C, H, W]; num_classes; input_scale / input_shift: uint8 pixels (0..255)
    enter the network as pixels * input_scale + input_shift (float32);
    tensors: the tensor names in the flat layout's order; dataset: the
    training data's name, where known.
    """
    scale, shift = model.image_transform
    meta: dict[str, Any] = {
        "format": FORMAT, "version": VERSION, "model": model.name, "spec": model.spec,
        "input_shape": [int(s) for s in model.input_shape],
        "num_classes": int(model.num_classes),
        "input_scale": float(scale), "input_shift": float(shift),
        "tensors": [name for name, _, _ in model.layout],
    }
    if dataset is not None:
        meta["dataset"] = str(dataset)
    return meta


def build_model(metadata: Mapping[str, Any]) -> Model:
    """The iasgd Model that `metadata` (`weights_metadata`, or a .safetensors
    file's string map) describes; ExportError if it is not iasgd's metadata or
    the spec does not fit its input shape."""
    try:  # safetensors' own string map works too: its non-string values are JSON
        metadata = {k: json.loads(v) if k in _JSON_KEYS and isinstance(v, str) else v
                    for k, v in metadata.items()}
    except ValueError as e:
        raise ExportError(f"unreadable iasgd weights metadata ({e})") from None
    missing = [k for k in ("spec", "input_shape", "num_classes") if k not in metadata]
    if metadata.get("format") != FORMAT or missing:
        raise ExportError("not iasgd weights metadata (it needs format 'iasgd-weights', spec, "
                          "input_shape and num_classes): write the file with "
                          "python -m iasgd.export")
    try:
        shape = tuple(int(s) for s in metadata["input_shape"])
        return models.build(str(metadata["spec"]), None, input_shape=shape,
                            num_classes=int(metadata["num_classes"]))
    except (TypeError, ValueError) as e:
        raise ExportError(f"the recorded model does not build: {e}") from None


# ------------------------------------------------------------------ checkpoints


def checkpoint_model(path: str | Path) -> tuple[Model, np.ndarray, dict]:
    """(model, params, config) of a run's checkpoint: the model rebuilt from
    the saved configuration (model, dataset, hidden; or input_shape and
    num_classes where the configuration gives them), params its flat float32
    (num_params,) array. ExportError (one line) for anything unusable."""
    if Path(path).is_file() and not h5py.is_hdf5(path):  # say so, rather than "corrupt"
        raise ExportError(f"{path} is not an iasgd checkpoint (not an HDF5 file)")
    try:
        config, snapshot = checkpoints.load(path)
    except checkpoints.CheckpointError as e:
        raise ExportError(str(e)) from None
    name = config.get("model")
    if not isinstance(name, str):
        raise ExportError(f"checkpoint {path} does not name its model in its configuration")
    shape, classes = config.get("input_shape"), config.get("num_classes")
    dataset = config.get("dataset")
    if dataset is None and (shape is None or classes is None):
        raise ExportError(f"checkpoint {path} names neither its dataset nor its input shape "
                          "and class count")
    if (shape is None or classes is None) and dataset not in models.DATASET_SHAPES:
        raise ExportError(f"checkpoint {path} does not record the input shape and class "
                          f"count of its model, trained on your file {dataset} by an older "
                          "iasgd: resume it with this one (--resume with more --epochs), "
                          "which records them, or train it again")
    hidden = config.get("hidden")
    try:
        model = models.build(
            name, None if shape is not None and classes is not None else dataset,
            input_shape=tuple(shape) if shape is not None else None,
            num_classes=classes,
            # the CLI records the mlp's default widths too; other models have none
            hidden=tuple(hidden) if hidden is not None and name == "mlp" else None)
    except (TypeError, ValueError) as e:
        raise ExportError(f"checkpoint {path}: its model does not build: {e}") from None
    params = snapshot.arrays.get("params")
    if params is None:
        raise ExportError(f"checkpoint {path} holds no parameters")
    if params.shape != (model.num_params,) or params.dtype != np.float32:
        raise ExportError(f"checkpoint {path}: its parameters ({params.dtype}, "
                          f"{params.size:,}) do not fit {name} ({model.num_params:,} float32)")
    return model, params, config


# ------------------------------------------------------------------ writing


def export(checkpoint: str | Path, to: str | Path) -> Model:
    """Write the parameters of a run's checkpoint to `to` (.pt, .safetensors
    or .npz, by its suffix), with `weights_metadata`; atomically: a reader
    never sees half a file. Returns the model. ExportError (one line) for a
    bad checkpoint, an unknown suffix or a missing optional package."""
    suffix = _suffix(to, FORMATS, "--to")
    model, params, config = checkpoint_model(checkpoint)
    if not np.isfinite(params).all():
        raise ExportError(f"checkpoint {checkpoint}: its parameters hold NaN or infinite "
                          "values (the run diverged); export an earlier checkpoint")
    save_weights(to, model, params, dataset=config.get("dataset"), suffix=suffix)
    return model


def save_weights(path: str | Path, model: Model, params: np.ndarray, *,
                 dataset: str | None = None, suffix: str | None = None) -> None:
    """Write flat float32 params (num_params,) of `model` to `path` as named
    tensors with their metadata, in the format its suffix names (FORMATS)."""
    suffix = suffix or _suffix(path, FORMATS, "the file")
    if params.shape != (model.num_params,) or params.dtype != np.float32:
        raise ExportError(f"params must be float32 of shape ({model.num_params},), "
                          f"got {params.dtype} {params.shape}")
    meta = weights_metadata(model, dataset)
    # copies: independent contiguous tensors (views of one flat array would be
    # stored as one shared buffer by torch, and refused by safetensors)
    tensors = {name: np.ascontiguousarray(t).copy() for name, t in model.tensors(params).items()}
    tensors |= torch_only_tensors(model)
    if suffix == ".pt":
        torch_ = _require("torch", f"writing {Path(path).name}")
        state = {name: torch_.from_numpy(t) for name, t in tensors.items()}
        _write(path, lambda f: torch_.save({"state_dict": state, "metadata": meta}, f))
    elif suffix == ".safetensors":
        st = _require("safetensors.numpy", f"writing {Path(path).name}", "safetensors")
        data = st.save(tensors, metadata={k: v if isinstance(v, str) else json.dumps(v)
                                          for k, v in meta.items()})
        _write(path, lambda f: f.write(data))
    else:
        _write(path, lambda f: np.savez(f, **tensors, **{NPZ_SPEC_KEY: np.array(json.dumps(meta))}))


def torch_only_tensors(model: Model) -> dict[str, np.ndarray]:
    """The tensors model's PyTorch modules hold and iasgd does not
    (Kind.torch_only: batch norm's batch count), with their values."""
    return {f"{ls.name}.{suffix}": np.array(value, np.int64) for ls in model.shapes
            for suffix, value in kind_of(ls.layer).torch_only.items()}


def _write(path: str | Path, write: Any) -> None:
    """Atomic write through iasgd.files.replacing, synced before the rename."""
    directory = Path(path).resolve().parent
    if not directory.is_dir():
        raise ExportError(f"{path}: directory {directory} does not exist; create it first")
    try:
        with files.replacing(path) as tmp, open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise ExportError(f"cannot write {path} ({e.strerror or e})") from None


# ------------------------------------------------------------------ reading


def read_weights(path: str | Path) -> tuple[dict[str, np.ndarray], dict[str, Any] | None]:
    """(tensors, metadata) of an exported file (.pt, .safetensors, .npz) or a
    checkpoint (.h5): tensors by name as numpy arrays of the stored dtype,
    metadata as `weights_metadata` wrote it, or None for a file without it
    (e.g. a plain PyTorch state dict). ExportError (one line) if unreadable."""
    suffix = _suffix(path, FORMATS + CHECKPOINT_SUFFIXES, "the weights file")
    if not Path(path).is_file():
        raise ExportError(f"{path} does not exist")
    if suffix in CHECKPOINT_SUFFIXES:
        model, params, config = checkpoint_model(path)
        return ({n: np.array(t) for n, t in model.tensors(params).items()},
                weights_metadata(model, config.get("dataset")))
    try:
        if suffix == ".pt":
            return _read_pt(path)
        if suffix == ".safetensors":
            return _read_safetensors(path)
        return _read_npz(path)
    except ExportError:
        raise
    except Exception as e:  # each reader raises its own kinds for a bad file
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ExportError(f"cannot read {path} as {suffix[1:]} ({reason[:200]})") from None


def _read_pt(path: str | Path) -> tuple[dict[str, np.ndarray], dict[str, Any] | None]:
    torch_ = _require("torch", f"reading {Path(path).name}")
    saved = torch_.load(path, map_location="cpu", weights_only=True)
    if not isinstance(saved, dict):
        raise ExportError(f"{path} holds a {type(saved).__name__}, not a dict of tensors")
    meta = None
    if "state_dict" in saved and isinstance(saved["state_dict"], dict):
        state, meta = saved["state_dict"], saved.get("metadata")
    else:  # a plain state dict, e.g. torch.save(net.state_dict(), path)
        state = saved
    tensors = {}
    for name, t in state.items():
        if not isinstance(t, torch_.Tensor):
            raise ExportError(f"{path}: {name!r} is a {type(t).__name__}, not a tensor")
        t = t.detach().cpu()
        if t.is_floating_point() and t.dtype not in (torch_.float16, torch_.float32,
                                                     torch_.float64):
            t = t.float()  # bfloat16 and kin, which numpy lacks: exact in float32
        tensors[str(name)] = t.numpy()
    return tensors, meta if isinstance(meta, dict) else None


def _read_safetensors(path: str | Path) -> tuple[dict[str, np.ndarray], dict[str, Any] | None]:
    st = _require("safetensors", f"reading {Path(path).name}")
    tensors = {}
    with st.safe_open(str(path), framework="np") as f:
        raw = f.metadata()
        for name in f.keys():  # noqa: SIM118 (a safe_open handle is no mapping)
            tensors[name] = f.get_tensor(name)
    if not raw:
        return tensors, None
    meta = {k: json.loads(v) if k in _JSON_KEYS else v for k, v in raw.items()}
    return tensors, meta


def _read_npz(path: str | Path) -> tuple[dict[str, np.ndarray], dict[str, Any] | None]:
    problem = npz_problem(Path(path), "tensors")
    if problem is not None:
        raise ExportError(f"{path} {problem}: write it with python -m iasgd.export")
    loaded = np.load(path, allow_pickle=False)
    if isinstance(loaded, np.ndarray):
        raise ExportError(f"{path} holds a single .npy array, not an .npz archive of tensors")
    with loaded as f:
        tensors = {name: f[name] for name in f.files if name != NPZ_SPEC_KEY}
        meta = json.loads(str(f[NPZ_SPEC_KEY][()])) if NPZ_SPEC_KEY in f.files else None
    return tensors, meta


def load_weights(path: str | Path, model: Model, *, check_spec: bool = True) -> np.ndarray:
    """Flat float32 parameters (model.num_params,) in `model.layout` order from
    exported weights (.pt, .safetensors, .npz) or a run's checkpoint (.h5):
    the starting point of a run (`--init`).

    Every tensor of the model must be there with its shape and a floating
    dtype (float16/64 are converted), finite, and nothing else; with
    check_spec, weights that record their model must record this one (the
    same spec and input normalisation: the same names and shapes can belong
    to another network, e.g. a ReLU moved). ExportError, one line naming the
    first mismatch, otherwise. float32 weights come back bit-exactly.
    """
    tensors, meta = read_weights(path)
    if check_spec and meta is not None:
        if meta.get("spec") is not None and meta["spec"] != model.spec:
            raise ExportError(f"{path} holds weights of {meta['spec']}, not of {model.spec}")
        scale, shift = model.image_transform
        recorded = (meta.get("input_scale", scale), meta.get("input_shift", shift))
        if recorded != (scale, shift):
            raise ExportError(f"{path} was trained on inputs pixels * {recorded[0]!r} + "
                              f"{recorded[1]!r}, this iasgd feeds pixels * {scale!r} + "
                              f"{shift!r}")
    params = np.empty(model.num_params, np.float32)
    for name, shape, off in model.layout:
        t = tensors.get(name)
        if t is None:
            raise ExportError(f"{path} has no tensor {name} {_shape(shape)} (it holds "
                              f"{', '.join(sorted(tensors)) or 'no tensors'})")
        if tuple(t.shape) != tuple(shape):
            raise ExportError(f"{path}: {name} has shape {_shape(t.shape)}, the model's is "
                              f"{_shape(shape)}")
        if not np.issubdtype(t.dtype, np.floating):
            raise ExportError(f"{path}: {name} is {t.dtype}, not floating point")
        if not np.isfinite(t).all():
            raise ExportError(f"{path}: {name} holds NaN or infinite values")
        params[off:off + math.prod(shape)] = t.reshape(-1)  # casts to float32
    extra = sorted(set(tensors) - {name for name, _, _ in model.layout}
                   - set(torch_only_tensors(model)))
    if extra:
        raise ExportError(f"{path} has a tensor {extra[0]} that {model.spec} does not have")
    return params


# ------------------------------------------------------------------ PyTorch


def torch_module(spec: Mapping[str, Any] | Model) -> torch.nn.Sequential:
    """The network as a `torch.nn.Sequential` of standard modules, from the
    metadata of an export (or an iasgd Model), with freshly initialised
    parameters: load the exported state dict into it with
    `load_state_dict(sd, strict=True)`.

    Its parameters are named and shaped like iasgd's (conv1.weight, ...,
    fc1.weight, ...); parameterless modules are relu1, pool1, flatten1, ....
    Each layer kind says what it is in torch (iasgd.nn.layers, Kind.torch):
    conv = Conv2d (stride 1, zero padding (k-1)/2 for "same"), pool =
    MaxPool2d(2) (floor), relu = ReLU, a dense layer on a map flattens it
    first (C order, Flatten), dense = Linear.
    Input: float32 (N, C, H, W) network inputs (uint8 pixels * input_scale +
    input_shift); output: logits (N, num_classes).
    """
    torch_ = _require("torch", "a PyTorch module")
    model = spec if isinstance(spec, Model) else build_model(spec)
    modules: OrderedDict[str, torch.nn.Module] = OrderedDict()
    counts: dict[str, int] = {}
    shape: tuple[int, ...] = model.input_shape
    for ls in model.shapes:
        for name, module in kind_of(ls.layer).torch(ls, shape):
            if any(True for _ in module.parameters()):
                modules[ls.name] = module  # named like iasgd's tensors
            else:
                counts[name] = counts.get(name, 0) + 1
                modules[f"{name}{counts[name]}"] = module
        shape = ls.shape
    return torch_.nn.Sequential(modules)


def load_torch(path: str | Path) -> torch.nn.Sequential:
    """The exported network (.pt, .safetensors, .npz or a checkpoint) as a
    torch module in eval mode, its parameters loaded strictly (`torch_module`)."""
    torch_ = _require("torch", "a PyTorch module")
    tensors, meta = read_weights(path)
    if meta is None:
        raise ExportError(f"{path} does not record its model; rebuild it with torch_module "
                          "and load the tensors yourself")
    net = torch_module(meta)
    try:
        net.load_state_dict({n: torch_.from_numpy(np.array(t)) for n, t in tensors.items()},
                            strict=True)
    except RuntimeError as e:
        raise ExportError(f"{path} does not fit {meta['spec']}: "
                          f"{' '.join(str(e).split())[:300]}") from None
    return net.eval()


# ------------------------------------------------------------------ helpers

# PyPI's torch is the CUDA build (several GB); a CPU is all iasgd uses
INSTALL = {"torch": "pip install torch --index-url https://download.pytorch.org/whl/cpu"}


def _require(module: str, what: str, package: str | None = None) -> ModuleType:
    """Import an optional package, or ExportError saying what to install."""
    try:
        return importlib.import_module(module)
    except ImportError:
        package = package or module.split(".")[0]
        raise ExportError(f"{what} needs {package}, which is not installed: "
                          f"{INSTALL.get(package, f'pip install {package}')}") from None


def _suffix(path: str | Path, allowed: Sequence[str], what: str) -> str:
    suffix = Path(path).suffix.lower()
    if suffix not in allowed:
        raise ExportError(f"{what} {path}: unknown format {suffix or '(no suffix)'}; "
                          f"use {', '.join(allowed[:-1])} or {allowed[-1]}")
    return suffix


def _shape(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(int(s)) for s in shape) + ")"


# ------------------------------------------------------------------ command line


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not usage + message
        raise ExportError(f"{message} (see python -m iasgd.export --help)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m iasgd.export",
                description="Write the trained parameters of an iasgd checkpoint as named "
                            "tensors (PyTorch's names and shapes) with the model's spec, for "
                            "PyTorch, safetensors or numpy.")
    p.add_argument("checkpoint", metavar="CHECKPOINT",
                   help="a run's checkpoint (python -m iasgd.run writes NAME.ckpt.h5)")
    p.add_argument("--to", required=True, metavar="FILE",
                   help="the file to write, its format by its suffix: .pt (torch.load with "
                        "weights_only=True; needs torch), .safetensors (needs safetensors) "
                        "or .npz (numpy)")
    return p


def main(argv: list[str] | None = None) -> int:
    """The command line; 0 written, 2 bad input (one line on stderr)."""
    try:
        args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
        model = export(args.checkpoint, args.to)
    except ExportError as e:
        print(f"iasgd: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(f"wrote {args.to}: {model.name} ({model.spec}), input "
          f"{'x'.join(map(str, model.input_shape))}, {model.num_classes} classes, "
          f"{model.num_params:,} parameters in {len(model.layout)} tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
