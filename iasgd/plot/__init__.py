"""Plots of finished runs: `python -m iasgd.plot RUNS [RUNS ...] [--target PCT] [--out FIG.png]`.

One figure, with only the panels that have data (docs/plots.md):

- test accuracy against training time (and by epoch, for runs that have epochs);
- training loss against training time and by epoch, where a run recorded it;
- time to a target test accuracy against the thread count, one line per
  algorithm variant (`--target PCT`; default: the highest whole percent every
  plotted run reaches);
- staleness as a survival curve: the share of applied updates with staleness
  >= tau against tau, both axes logarithmic (x symlog, so tau = 0 shows), each
  bounded run's bound dashed;
- the interval size y and the active thread count m over time, for runs in
  which one of them changed (a fixed y is not a schedule).

Runs that differ only by their seed are one group: a mean line and a shaded
min-max band over the seeds (on the union of their evaluation times, where
every seed has data), their staleness histograms pooled, labelled "(3 seeds)".
Each group is labelled from its configuration (algorithm, threads, y,
schedules), simulated runs as SIMULATED.

Inputs: results of `python -m iasgd.run` (real or `--simulate`), and runs of
a `bench/scaling.py` sweep JSON, picked as `SWEEP.json:ALGO:THREADS[:SEED]`;
each of ALGO, THREADS and SEED may be a comma-separated list, and without
SEED every seed is taken (e.g. `sweep.json:hogwild,interval:16,128`). Sweeps
record test accuracy over time and the staleness histogram, not the loss,
the epochs or the schedules.

Bad input is one line on stderr and exit code 2. Needs matplotlib
(`pip install 'iasgd[plot]'`).

The modules, bottom up: `readers` (files to `Run`s), `grouping` (labels,
seed groups and what is computed over them), `panels` (one Axes each),
`figures` (the grid, title and legend) and `cli` (the command line; also
`python -m iasgd.plot`). The names below are the Python API:

    runs = plot.load("a.json") + plot.load("sweep.json:hogwild:16")
    plot.label_runs(runs)
    plot.draw(runs, Path("fig.png"), targets=[55])
"""

from iasgd.plot.cli import main
from iasgd.plot.figures import draw, figure
from iasgd.plot.grouping import describe, group_runs, label_runs
from iasgd.plot.readers import PlotError, Run, load

__all__ = ["PlotError", "Run", "describe", "draw", "figure", "group_runs", "label_runs", "load",
           "main"]
