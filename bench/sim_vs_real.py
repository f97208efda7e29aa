"""The simulator against real threads: staleness and accuracy per epoch.

    python bench/sim_vs_real.py --real bench/results/cifar10-2-128.partial.json \\
        --sim bench/results/simulated-cifar10-128-2cores.json --threads 128

Reads a real sweep of bench/scaling.py and one or more simulated ones
(`--simulate --sim-cores C`, the same algorithms, thread count, lr and
seeds) and, for every algorithm both have at --threads, compares:

- the staleness distribution over all seeds: mean, median, 90th and 99th
  percentile and max tau, and the total variation distance between the two
  distributions (half the summed absolute difference of the probabilities:
  0 is identical, 1 disjoint);
- the test accuracy at each epoch end (mean over seeds) over the epochs both
  reached: the largest and the mean absolute difference, in points;
- where both sweeps have --eval-every evaluations, the same at each
  evaluation point (by applied updates) both reached.

Prints a Markdown table and writes <name>.json, <name>.md and, with
matplotlib, <name>.png (staleness CDFs and accuracy per epoch).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from iasgd import files, sweeps  # noqa: E402


def runs_at(path: Path, threads: int) -> dict[str, list[dict]]:
    """{algorithm: runs at `threads`} of a sweep file (finished or partial);
    exits with code 2 and one line if the file is not a sweep."""
    try:
        saved = sweeps.read(path)
    except sweeps.SweepError as e:
        print(f"sim_vs_real.py: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    return {algo: by_n[str(threads)] for algo, by_n in saved["runs"].items()
            if str(threads) in by_n}


def pooled_hist(runs: list[dict]) -> np.ndarray:
    """Staleness counts summed over runs, shape (max tau + 1,)."""
    hist = np.zeros(max(len(r["staleness_hist"]) for r in runs), dtype=np.int64)
    for r in runs:
        hist[:len(r["staleness_hist"])] += r["staleness_hist"]
    return hist


def percentile(hist: np.ndarray, q: float) -> int:
    """The smallest tau with at least a share q of the updates at or below it."""
    return int(np.searchsorted(np.cumsum(hist) / hist.sum(), q))


def staleness_facts(hist: np.ndarray) -> dict:
    taus = np.arange(len(hist))
    return {"mean": float((taus * hist).sum() / hist.sum()), "p50": percentile(hist, 0.5),
            "p90": percentile(hist, 0.9), "p99": percentile(hist, 0.99),
            "max": int(np.flatnonzero(hist)[-1])}


def total_variation(a: np.ndarray, b: np.ndarray) -> float:
    """Half the L1 distance between two histograms' probabilities (0..1)."""
    n = max(len(a), len(b))
    p, q = np.zeros(n), np.zeros(n)
    p[:len(a)], q[:len(b)] = a / a.sum(), b / b.sum()
    return float(0.5 * np.abs(p - q).sum())


def accuracy_per_epoch(runs: list[dict]) -> list[float]:
    """Mean test accuracy over runs at each epoch end that every run reached."""
    epochs = min(len(r["curve"]) for r in runs)
    return [statistics.mean(r["curve"][e][1] for r in runs) for e in range(epochs)]


def accuracy_per_eval(runs: list[dict]) -> dict[int, float]:
    """{applied: mean test accuracy over runs} at the evaluation points every
    run has (none where a run has no evals)."""
    by_run = [{int(a): acc for _, a, acc in r.get("evals") or []} for r in runs]
    common = set.intersection(*(set(b) for b in by_run)) if by_run else set()
    return {a: statistics.mean(b[a] for b in by_run) for a in sorted(common)}


def compare(real: list[dict], simulated: list[dict]) -> dict:
    """The agreement of one algorithm's real and simulated runs."""
    real_hist, sim_hist = pooled_hist(real), pooled_hist(simulated)
    real_acc, sim_acc = accuracy_per_epoch(real), accuracy_per_epoch(simulated)
    epochs = min(len(real_acc), len(sim_acc))
    diff = [abs(a - b) for a, b in zip(real_acc[:epochs], sim_acc[:epochs], strict=True)]
    real_ev, sim_ev = accuracy_per_eval(real), accuracy_per_eval(simulated)
    points = sorted(set(real_ev) & set(sim_ev))
    ev_diff = [abs(real_ev[a] - sim_ev[a]) for a in points]
    return {"seeds": [len(real), len(simulated)],
            "staleness": {"real": staleness_facts(real_hist),
                          "simulated": staleness_facts(sim_hist),
                          "total_variation": total_variation(real_hist, sim_hist)},
            "accuracy_per_epoch": {"real": real_acc[:epochs], "simulated": sim_acc[:epochs],
                                   "epochs": epochs,
                                   "max_abs_diff": max(diff) if diff else None,
                                   "mean_abs_diff": statistics.mean(diff) if diff else None},
            "accuracy_per_eval": {"points": points, "real": [real_ev[a] for a in points],
                                  "simulated": [sim_ev[a] for a in points],
                                  "max_abs_diff": max(ev_diff) if ev_diff else None,
                                  "mean_abs_diff": statistics.mean(ev_diff) if ev_diff
                                  else None},
            "samples_per_s": {"real": statistics.median(r["samples_per_s"] for r in real),
                              "simulated": statistics.median(r["samples_per_s"]
                                                             for r in simulated)}}


def table(comparison: dict[str, dict], threads: int) -> str:
    lines = [f"Real threads against the simulator at {threads} threads (real / simulated)", "",
             "| algorithm | seeds | mean tau | median | p90 | p99 | max | TV distance | "
             "epochs | acc at last epoch | max / mean abs acc diff | evals: max / mean | "
             "samples/s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for algo, c in comparison.items():
        r, s = c["staleness"]["real"], c["staleness"]["simulated"]
        acc = c["accuracy_per_epoch"]
        last = (f"{100 * acc['real'][-1]:.1f}% / {100 * acc['simulated'][-1]:.1f}%"
                if acc["epochs"] else "-")
        diffs = (f"{100 * acc['max_abs_diff']:.1f} / {100 * acc['mean_abs_diff']:.1f} pt"
                 if acc["epochs"] else "-")
        ev = c["accuracy_per_eval"]
        ev_diffs = (f"{100 * ev['max_abs_diff']:.1f} / {100 * ev['mean_abs_diff']:.1f} pt "
                    f"({len(ev['points'])})" if ev["points"] else "-")
        rate = c["samples_per_s"]
        lines.append(
            f"| {algo} | {c['seeds'][0]} / {c['seeds'][1]} | {r['mean']:.1f} / {s['mean']:.1f} "
            f"| {r['p50']} / {s['p50']} | {r['p90']} / {s['p90']} | {r['p99']} / {s['p99']} "
            f"| {r['max']} / {s['max']} | {c['staleness']['total_variation']:.2f} "
            f"| {acc['epochs']} | {last} | {diffs} | {ev_diffs} "
            f"| {rate['real']:,.0f} / {rate['simulated']:,.0f} |")
    return "\n".join(lines)


def plot(comparison: dict[str, dict], real: dict, simulated: dict, out: Path) -> Path | None:
    """Staleness CDFs (real solid, simulated dashed) and accuracy per epoch."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, (algo, c) in enumerate(comparison.items()):
        for runs, style, kind in ((real[algo], "-", "real"), (simulated[algo], "--", "sim")):
            hist = pooled_hist(runs)
            left.plot(np.arange(len(hist)), np.cumsum(hist) / hist.sum(), style,
                      color=f"C{i}", label=f"{algo} {kind}")
        acc = c["accuracy_per_epoch"]
        epochs = np.arange(1, acc["epochs"] + 1)
        right.plot(epochs, acc["real"], "-", color=f"C{i}", label=f"{algo} real")
        right.plot(epochs, acc["simulated"], "--", color=f"C{i}", label=f"{algo} sim")
    left.set(xscale="symlog", xlabel="staleness tau", ylabel="share of updates <= tau",
             title="staleness CDF")
    right.set(xlabel="epoch", ylabel="test accuracy (mean over seeds)",
              title="accuracy per epoch")
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    fig.tight_layout()
    path = out.with_suffix(".png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--real", required=True, help="a real sweep's JSON (or .partial.json)")
    p.add_argument("--sim", required=True, nargs="+", help="simulated sweeps' JSON files")
    p.add_argument("--threads", type=int, default=128)
    p.add_argument("--name", default=None, help="output name (default: sim-vs-real-<threads>)")
    p.add_argument("--out-dir", default=str(REPO / "bench" / "results"))
    args = p.parse_args(argv)
    real = runs_at(Path(args.real), args.threads)
    simulated = {}
    for path in args.sim:
        simulated.update(runs_at(Path(path), args.threads))
    common = [a for a in simulated if a in real]
    if not common:
        p.error(f"no algorithm has runs at {args.threads} threads in both --real and --sim")
    comparison = {a: compare(real[a], simulated[a]) for a in common}
    text = table(comparison, args.threads)
    print(text)
    out = Path(args.out_dir) / (args.name or f"sim-vs-real-{args.threads}")
    out.parent.mkdir(parents=True, exist_ok=True)
    document = {"real": args.real, "simulated": args.sim, "threads": args.threads,
                "comparison": comparison}
    files.write_json_atomic(out.with_suffix(".json"), document)
    out.with_suffix(".md").write_text(text + "\n")
    png = plot(comparison, real, simulated, out)
    print(f"wrote {out.with_suffix('.json')}, {out.with_suffix('.md')}"
          + (f" and {png.name}" if png else ""))
    return document


if __name__ == "__main__":
    main()
