"""python -m iasgd.plot (iasgd.plot.cli): the figure beside the first file
and its path printed; bad arguments are one line on stderr and exit code 2,
with no figure written."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from documents import PNG_MAGIC, REPO, results, sweep, write

from iasgd.plot import cli


def test_two_runs_overlay_beside_the_first_file(tmp_path, capsys):
    a = write(tmp_path / "a.json", results("interval", 8, interval=16))
    b = write(tmp_path / "b.json", results("hogwild", 8))
    assert cli.main([a, b]) == 0
    assert capsys.readouterr().out == f"{tmp_path / 'a.png'}\n"  # the path, and only it
    assert (tmp_path / "a.png").read_bytes()[:8] == PNG_MAGIC
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "a.png", "b.json"]


def test_bad_arguments_are_one_line(tmp_path, capsys):
    good = write(tmp_path / "r.json", results())
    sweep_path = write(tmp_path / "s.json", sweep())
    for args, needle in (
        ([], "required"),
        ([str(tmp_path / "none.json")], "no such file"),
        ([good, "--out", str(tmp_path / "f.xyz")], "unknown figure format .xyz"),
        ([good, "--out", str(tmp_path / "no" / "f.png")], "does not exist"),
        ([good, "--out", str(tmp_path)], "unknown figure format"),
        ([sweep_path], "pick runs as"),
        ([f"{sweep_path}:hogwild:16"], "no runs hogwild:16"),
        ([f"{sweep_path}:hogwild:2:7"], "has seeds 0-1"),
        ([f"{good}:hogwild:2"], "not a bench/scaling.py sweep"),
    ):
        assert cli.main(args) == 2, args
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1, (args, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "s.json"]


def test_a_checkpoint_given_for_results_says_which_file_to_pass(tmp_path, capsys):
    """Issue 60, item 5: a run's checkpoint (HDF5) was 'cannot read it ('utf-8'
    codec ...)'; it is named for what it is, with the results file beside it."""
    from iasgd import checkpoints, run

    assert run.main(["--dataset", "synthetic", "--epochs", "1", "--quiet", "--out",
                     str(tmp_path / "r.json")]) == 0
    ckpt = tmp_path / "r.ckpt.h5"
    checkpoints.load(str(ckpt))  # a real checkpoint
    assert cli.main([str(ckpt)]) == 2
    results = tmp_path / "r.json"
    assert capsys.readouterr().err == (f"iasgd: error: {ckpt} is a checkpoint, not a results "
                                       f"file: pass the run's results file, {results}\n")
    other = tmp_path / "cache.h5"
    other.write_bytes(ckpt.read_bytes())
    assert cli.main([str(other)]) == 2
    assert "is an HDF5 file, not a results file" in capsys.readouterr().err


def test_without_matplotlib_it_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    assert cli.main([write(tmp_path / "r.json", results())]) == 2
    err = capsys.readouterr().err
    assert err == "iasgd: error: plotting needs matplotlib: pip install 'iasgd[plot]'\n"


def test_an_unwritable_directory_is_one_line(tmp_path, capsys, monkeypatch):
    path = write(tmp_path / "r.json", results())

    def refuse(*_a, **_k):
        raise PermissionError(13, "Permission denied", str(tmp_path))

    monkeypatch.setattr("tempfile.mkstemp", refuse)
    assert cli.main([path]) == 2
    err = capsys.readouterr().err
    assert "cannot write the figure" in err and err.count("\n") == 1


@pytest.mark.parametrize(("values", "targets"), [
    (None, []),
    (["55"], [55.0]),
    (["50,55", "57.5%", "55"], [50.0, 55.0, 57.5]),
    ([" 60 % , 1"], [60.0, 1.0]),
])
def test_targets_are_percent_repeatable_or_comma_separated(values, targets):
    assert cli.parse_targets(values) == targets


@pytest.mark.parametrize(("args", "needle"), [
    (["--target", "abc"], "--target abc: abc is not a number"),
    (["--target", "55,"], "nothing is not a number"),
    (["--target", "0.55"], "--target 0.55: 0.55 is not a test accuracy in percent from 1 to 100"),
    (["--target", "150"], "from 1 to 100"),
    (["--target", "nan"], "from 1 to 100"),
    (["--target", "50,51,52,53,54"], "at most 4 targets, got 5"),
    (["--target"], "expected one argument"),
])
def test_bad_targets_are_one_line(tmp_path, capsys, args, needle):
    path = write(tmp_path / "r.json", results())
    assert cli.main([path, *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.startswith("iasgd: error: ") and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_python_dash_m_runs_the_command_line(tmp_path):
    """The package's __main__: the same command line, its exit code and its one line."""
    path = write(tmp_path / "r.json", results())
    done = subprocess.run([sys.executable, "-m", "iasgd.plot", path, "--target", "0.5"],
                          capture_output=True, text=True, cwd=REPO, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == ("iasgd: error: --target 0.5: 0.5 is not a test accuracy in percent "
                           "from 1 to 100 (55 means 55 %)\n")


def test_the_package_names_its_python_api(tmp_path):
    """plot.load, label_runs and draw: what a script needs, without the submodules."""
    import iasgd.plot as plot

    runs = plot.load(write(tmp_path / "r.json", results()))
    plot.label_runs(runs)
    plot.draw(runs, tmp_path / "f.png", targets=[55])
    assert (tmp_path / "f.png").read_bytes()[:8] == PNG_MAGIC
    assert plot.main is cli.main and issubclass(plot.PlotError, ValueError)
