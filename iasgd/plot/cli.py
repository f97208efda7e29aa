"""The command line of `python -m iasgd.plot`: its parser, --target and
--out; bad input is one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from iasgd.plot.figures import draw
from iasgd.plot.grouping import label_runs
from iasgd.plot.panels import TARGET_STYLES
from iasgd.plot.readers import PlotError, load

EXIT_USAGE = 2
INSTALL_HINT = "pip install 'iasgd[plot]'"


def parse_targets(values: Sequence[str] | None) -> list[float]:
    """--target values (each "55", "57.5" or "50,55"; "%" allowed) -> percents,
    in order, without repeats. PlotError (one line) for anything else."""
    targets: list[float] = []
    for value in values or []:
        for part in value.split(","):
            text = part.strip().removesuffix("%").strip()
            try:
                pct = float(text)
            except ValueError:
                raise PlotError(f"--target {value}: {part.strip() or 'nothing'} is not a "
                                "number; give test accuracy in percent, e.g. --target 55"
                                ) from None
            if not 1 <= pct <= 100:  # also refuses NaN
                raise PlotError(f"--target {value}: {text} is not a test accuracy in percent "
                                "from 1 to 100 (55 means 55 %)")
            if pct not in targets:
                targets.append(pct)
    if len(targets) > len(TARGET_STYLES):
        raise PlotError(f"--target: at most {len(TARGET_STYLES)} targets, got {len(targets)}")
    return targets



class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise PlotError(message)


def build_parser() -> argparse.ArgumentParser:
    """The command line of `python -m iasgd.plot` (errors raise PlotError)."""
    p = _Parser(prog="python -m iasgd.plot",
                description="Plot runs of iasgd in one figure: accuracy (and loss) over time "
                            "and epochs, time to a target accuracy against threads, staleness "
                            "as a survival curve, and the schedules of y and m; only panels "
                            "with data. Runs that differ only by seed are one mean line with "
                            "a min-max band. See docs/plots.md.")
    p.add_argument("results", nargs="+", metavar="RUNS",
                   help="a results file of python -m iasgd.run, or runs of a bench/scaling.py "
                        "sweep as SWEEP.json:ALGO:THREADS[:SEED] (each part may be a "
                        "comma-separated list; no SEED: every seed), e.g. "
                        "sweep.json:hogwild,interval:16,128")
    p.add_argument("--target", action="append", metavar="PCT",
                   help="test accuracy in percent for the time-to-target panel (1-100; "
                        "repeatable or comma-separated, at most 4; default: the highest whole "
                        "percent every plotted run reaches)")
    p.add_argument("--out", default=None, metavar="FIG.png",
                   help="figure file; its suffix picks the format (default: the first "
                        "file's name with .png)")
    return p


def output_path(out: str | None, first: str) -> Path:
    """Where the figure goes: `out`, or beside the first input as NAME.png."""
    from matplotlib.backend_bases import FigureCanvasBase

    path = Path(out) if out else Path(first).with_suffix(".png")
    formats = FigureCanvasBase.get_supported_filetypes()
    if path.suffix[1:].lower() not in formats:
        raise PlotError(f"--out {path}: unknown figure format {path.suffix or '(none)'}; "
                        f"use one of {', '.join('.' + f for f in sorted(formats))}")
    if path.is_dir():
        raise PlotError(f"--out {path} is a directory; give a file name")
    if not path.resolve().parent.is_dir():
        raise PlotError(f"--out {path}: directory {path.resolve().parent} does not exist")
    return path


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit code (0, or 2 after one line on stderr)."""
    try:
        args = build_parser().parse_args(argv)
        targets = parse_targets(args.target)
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise PlotError(f"plotting needs matplotlib: {INSTALL_HINT}") from None
        runs = [run for spec in args.results for run in load(spec)]
        first = args.results[0]
        out = output_path(args.out, first if Path(first).is_file() else first.split(":")[0])
        label_runs(runs)
        draw(runs, out, targets)
    except PlotError as e:
        print(f"iasgd: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:  # e.g. no permission to write beside the results
        print(f"iasgd: error: cannot write the figure ({e.strerror}: {e.filename})",
              file=sys.stderr)
        return EXIT_USAGE
    print(out)
    return 0

