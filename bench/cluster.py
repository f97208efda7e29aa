"""The Ray backend against the threaded engine on this machine, and what
that says about real clusters.

    python bench/cluster.py --dataset cifar10 \\
        --archive ../shared/data/cifar-10-jpeg-python.tar.gz \\
        --sync-every 1,4,16,64 --time-budget 60 --eval-every 1000 --target 0.5 --project
    python bench/cluster.py --quick --project   # synthetic data, seconds per run

Each configuration trains --algo for --time-budget seconds (evaluation
excluded), one run after another, --seeds runs each: the threaded engine
with two threads (`--backend threads --threads 2`), then for every K of
--sync-every the Ray backend with two nodes of one thread each (`--backend
ray --nodes 2 --threads 1 --sync-every K`: a node exchanges its updates with
the parameter server every K updates it applied). Ray is started on this
machine unless this process already joined one (ray.is_initialized()).
--quick trains QUICK_EPOCHS epochs of a small synthetic set instead (at K=4,
one seed), each run stopped after QUICK_BUDGET_S at most: a budget of a
couple of seconds would end a Ray run while its actors start (below).

Per configuration the table gives applied samples/s and its ratio to the
threaded engine's (measured in the same invocation), the training seconds to
--target test accuracy (interpolated between evaluations every --eval-every
applied updates) and its ratio to the threaded engine's, the bytes a node
moved per applied sample, the server's busy fraction and pushes/s (both over
the nodes' training time), the round trip of an exchange (p50 / p99 over
each node's exchanges, the server's waits for tickets excluded), the
seconds a node's threads sat idle waiting for an exchange, and the test
accuracy at the end of the budget.

The training clock of the Ray backend is the driver's: it starts once every
node actor is up and has loaded its compiled code, as the threaded engine
warms up before its clock. The table shows what remains ("startup in
clock": the clock's seconds before the slowest node started training) and
the Ray runs' samples/s on the nodes' own clocks (each node's applied
samples over its training seconds, summed over the nodes).

--project adds a projection on paper to clusters of 8 and 64 nodes of 16
cores each on 10 GbE (`project`, whose docstring states the assumptions).

Results: bench/results/<name>.json and <name>.md (default name
cluster-<dataset>-<algo>, quick-cluster-... with --quick), written
atomically. A real run waits before each run until other processes use at
most --max-foreign of the CPUs (bench/scaling.py), so that a sweep running
beside it does not distort it; threads runs record that share as
foreign_cpu (Ray runs cannot: their work is done by other processes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import scaling  # noqa: E402

from iasgd import data as datasets  # noqa: E402
from iasgd import engine, files, results  # noqa: E402
from iasgd.algorithms import ALGORITHMS  # noqa: E402
from iasgd.nn import models  # noqa: E402

THREADS = 2  # threads of the threaded engine; Ray: THREADS nodes of one thread each
BYTES_PER_PARAM = 4  # float32
LINK_BYTES_PER_S = 1.25e9  # 10 GbE, each way
CORES_PER_NODE = 16
PROJECTED_NODES = (8, 64)
PROJECTED_K = (16, 64, 256, 1024, 4096)
BUSY_LIMIT = 0.5  # the server's network and CPU utilisation a K must keep below
QUICK_EPOCHS = 3  # of the 2,000 synthetic images: 375 updates at b=16
QUICK_BUDGET_S = 30.0  # --quick: a safety net only (a run ends after QUICK_EPOCHS)
STALLED_WARNING = 0.5  # share of a Ray run's training time its nodes sat idle, flagged


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parallel = [a for a in ALGORITHMS if ALGORITHMS[a].parallel]
    p.add_argument("--algo", default="hogwild", choices=parallel)
    p.add_argument("--sync-every", default="1,4,16,64",
                   help="K values of the Ray runs, comma-separated")
    p.add_argument("--time-budget", type=float, default=60.0, help="training seconds per run")
    p.add_argument("--eval-every", type=int, default=1000, metavar="N",
                   help="evaluate every N applied updates (outside the training clock)")
    p.add_argument("--target", type=float, default=0.5,
                   help="test accuracy whose time to reach is compared")
    p.add_argument("--seeds", type=int, default=1, help="runs per configuration")
    p.add_argument("--dataset", default="cifar10", choices=datasets.DATASETS)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--archive", default=None)
    p.add_argument("--model", default="lenet",
                   help="a preset (lenet, mlp, vgg-small) or a layer spec, as iasgd.run takes")
    p.add_argument("--batch-size", type=int, default=engine.TrainConfig.batch_size)
    p.add_argument("--lr", type=float, default=engine.TrainConfig.lr)
    p.add_argument("--project", action="store_true",
                   help="project the measured figures to 8 and 64 nodes of 16 cores on 10 GbE")
    p.add_argument("--max-foreign", type=float, default=None, metavar="SHARE",
                   help="before each run, wait until other processes use at most this share "
                        "of the CPUs (default 0.15; off with --quick; 1: off)")
    p.add_argument("--name", default=None, help="results name (default: from the options)")
    p.add_argument("--out-dir", default=str(REPO / "bench" / "results"),
                   help="where the JSON and markdown files go")
    p.add_argument("--quick", action="store_true",
                   help=f"synthetic data, {QUICK_EPOCHS} epochs of it (at most "
                        f"{QUICK_BUDGET_S:g} s), K=4, one seed: a smoke test in seconds")
    args = p.parse_args(argv)
    try:
        args.sync_every = [int(k) for k in args.sync_every.split(",")]
    except ValueError as e:
        p.error(f"--sync-every takes comma-separated integers ({e})")
    if min(args.sync_every) < 1 or args.seeds < 1 or args.eval_every < 0:
        p.error("--sync-every values and --seeds must be >= 1, --eval-every >= 0")
    args.epochs = 1_000_000  # the time budget ends a run
    if args.quick:  # QUICK_EPOCHS, and a budget only as a safety net
        args.dataset, args.epochs = "synthetic", QUICK_EPOCHS
        args.time_budget = min(args.time_budget, QUICK_BUDGET_S)
        args.sync_every, args.seeds = [4], 1
        args.lr = 0.02  # as scaling.py --quick: learns the synthetic set within the budget
    if args.max_foreign is None:
        args.max_foreign = 1.0 if args.quick else 0.15
    try:
        models.build(args.model, args.dataset)
    except ValueError as e:
        p.error(f"--model {args.model}: {e}")
    args.name = args.name or (f"{'quick-' if args.quick else ''}cluster-{args.dataset}-"
                              f"{args.algo}")
    return args


# ------------------------------------------------------------------- runs

def configurations(args: argparse.Namespace) -> dict[str, dict]:
    """The TrainConfig fields of each configuration, by label: the threaded
    engine first (the others' ratios refer to it), then Ray at each K."""
    configs = {f"threads-{THREADS}": {"backend": "threads", "threads": THREADS}}
    for k in args.sync_every:
        configs[f"ray-{THREADS}x1-K{k}"] = {"backend": "ray", "nodes": THREADS, "threads": 1,
                                            "sync_every": k}
    return configs


def config_for(args: argparse.Namespace, fields: dict, seed: int) -> engine.TrainConfig:
    return engine.TrainConfig(algo=args.algo, batch_size=args.batch_size, lr=args.lr,
                              seed=seed, epochs=args.epochs, time_budget=args.time_budget,
                              eval_every=args.eval_every, **fields)


def run_one(model: models.Model, data, cfg: engine.TrainConfig, target: float) -> dict:
    """One run's figures (cluster ones None for the threaded engine)."""
    result = engine.train(model, data, cfg)
    doc = results.results_document({}, result, model.num_params)
    run = {"seed": cfg.seed, "status": str(doc["status"]),
           "train_time_s": doc["train_time_s"], "samples_per_s": doc["samples_per_s"],
           "final_accuracy": doc["final_test_accuracy"], "evals": doc["evals"],
           "curve": [[e["wall_s"], e["test_accuracy"]] for e in doc["epochs"]]}
    run["time_to_target_s"] = scaling.time_to_target(scaling.accuracy_points(run), target)
    run.update(cluster_figures(doc["cluster"], doc["train_time_s"]))
    return run


def cluster_figures(cluster: dict | None, train_time_s: float) -> dict:
    """What a Ray run adds, from RunResult.cluster: the nodes' samples/s
    (each over its own training seconds, summed), bytes per sample, the
    server's busy fraction and pushes/s over the nodes' training seconds
    (the slowest node's), its busy seconds, round trips (median of the
    nodes' p50, largest p99; ms), stalled seconds per node, and the
    training clock's seconds before the nodes started (startup_s)."""
    if cluster is None:
        return dict.fromkeys(("nodes_samples_per_s", "bytes_per_sample", "server_busy",
                              "pushes_per_s", "server_busy_s", "pushes", "rtt_ms_p50",
                              "rtt_ms_p99", "stalled_s", "startup_s", "nodes", "server"))
    nodes, server = cluster["nodes"], cluster["server"]
    seconds = max((n["seconds"] for n in nodes), default=0.0)
    busy_s = server_busy_seconds(server)
    return {
        "nodes_samples_per_s": sum(n["samples_per_s"] for n in nodes),
        "bytes_per_sample": cluster["bytes_per_sample"],
        "server_busy": busy_s / seconds if seconds > 0 else None,
        "pushes_per_s": server["pushes"] / seconds if seconds > 0 else None,
        "server_busy_s": busy_s, "pushes": server["pushes"],
        "rtt_ms_p50": statistics.median(n["rtt_ms_p50"] for n in nodes) if nodes else None,
        "rtt_ms_p99": max((n["rtt_ms_p99"] for n in nodes), default=None),
        "stalled_s": statistics.mean(n["stalled_s"] for n in nodes) if nodes else None,
        "startup_s": max(train_time_s - seconds, 0.0) if nodes else None,
        "nodes": [{k: n[k] for k in ("node", "host", "applied", "samples_per_s", "seconds",
                                     "pushes", "carried", "stalled_s", "exchange_s",
                                     "server_wait_s", "bytes", "rtt_ms_p50", "rtt_ms_p99")}
                  for n in nodes],
        "server": server,
    }


def server_busy_seconds(server: dict) -> float:
    """Seconds the server spent applying pushes and copying its parameters
    for the replies (its lock held; Ray's transfer and (de)serialisation not
    included), from its summary: busy fraction / pushes per s * pushes."""
    if not server["pushes_per_s"]:
        return 0.0
    return server["busy_fraction"] / server["pushes_per_s"] * server["pushes"]


def run_all(args: argparse.Namespace, model: models.Model, data) -> dict[str, list[dict]]:
    """Every configuration's runs, seed by seed (so that a drift of the
    machine's speed hits every configuration alike)."""
    configs = configurations(args)
    runs: dict[str, list[dict]] = {label: [] for label in configs}
    each = f"{args.time_budget:g} s of training" + (
        f" or {args.epochs} epochs, whichever ends first" if args.quick else "")
    print(f"{len(configs) * args.seeds} runs of {each} each", flush=True)
    for seed in range(args.seeds):
        for label, fields in configs.items():
            print(f"{label} seed={seed} ...", end=" ", flush=True)
            if args.max_foreign < 1:
                scaling.wait_until_quiet(args.max_foreign)
            before, t0 = scaling.machine_cpu_s(), time.perf_counter()
            run = run_one(model, data, config_for(args, fields, seed), args.target)
            run["foreign_cpu"] = (scaling.foreign_share(before, scaling.machine_cpu_s(),
                                                        time.perf_counter() - t0)
                                  if fields["backend"] == "threads" else None)
            runs[label].append(run)
            print(f"{run['samples_per_s']:,.0f} samples/s, "
                  f"acc {100 * (run['final_accuracy'] or 0):.1f}%", flush=True)
    return runs


# ---------------------------------------------------------------- summary

def mean_of(runs: list[dict], name: str) -> float | None:
    values = [r[name] for r in runs if r[name] is not None]
    return statistics.mean(values) if values else None


def summarise(runs: list[dict], base: dict | None) -> dict:
    """A configuration's figures over its seeds: median samples/s, mean
    time to target (None unless every seed reached it), means of the rest;
    the ratios to `base` (the threaded engine's summary; None: this is it)."""
    times = [r["time_to_target_s"] for r in runs]
    summary = {
        "samples_per_s": statistics.median(r["samples_per_s"] for r in runs),
        "time_to_target_s": statistics.mean(times) if None not in times else None,
        "reached": sum(t is not None for t in times), "seeds": len(runs),
        **{name: mean_of(runs, name) for name in (
            "final_accuracy", "nodes_samples_per_s", "bytes_per_sample", "server_busy",
            "pushes_per_s", "rtt_ms_p50", "rtt_ms_p99", "stalled_s", "startup_s")},
    }
    base = base or summary
    summary["samples_per_s_ratio"] = (summary["samples_per_s"] / base["samples_per_s"]
                                      if base["samples_per_s"] else None)
    summary["time_to_target_ratio"] = (summary["time_to_target_s"] / base["time_to_target_s"]
                                       if summary["time_to_target_s"] is not None
                                       and base["time_to_target_s"] else None)
    return summary


def stall_warnings(summary: dict[str, dict], runs: dict[str, list[dict]]) -> list[str]:
    """A line for each Ray configuration whose nodes sat idle, waiting for
    an exchange, for more than STALLED_WARNING of their training seconds:
    its throughput says more about the exchanges than about the nodes."""
    lines = []
    for label, rs in runs.items():
        stalled = summary[label]["stalled_s"]
        seconds = [n["seconds"] for r in rs for n in r["nodes"] or []]
        if stalled is None or not seconds:
            continue
        if stalled > STALLED_WARNING * statistics.mean(seconds):
            lines.append(f"WARNING: {label}: the nodes sat idle waiting for an exchange for "
                         f"{stalled:.1f} of their {statistics.mean(seconds):.1f} training "
                         "seconds")
    return lines


def fmt(value: float | None, spec: str, scale: float = 1.0, suffix: str = "") -> str:
    """`value * scale` formatted with `spec`, or "-" when there is none."""
    return "-" if value is None else f"{value * scale:{spec}}{suffix}"


def table(summary: dict[str, dict], target: float) -> str:
    """The markdown table: a row per configuration."""
    pct = f"{100 * target:.0f}%"
    lines = [f"| configuration | samples/s | vs threads | samples/s, nodes' clocks | "
             f"time to {pct} (s) | vs threads | "
             "bytes/sample | server busy | pushes/s | RTT p50 / p99 (ms) | stalled s/node | "
             "startup in clock (s) | acc at budget |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for label, s in summary.items():
        ttt = (fmt(s["time_to_target_s"], ".1f") if s["time_to_target_s"] is not None
               else f"not reached ({s['reached']}/{s['seeds']})")
        rtt = ("-" if s["rtt_ms_p50"] is None
               else f"{s['rtt_ms_p50']:.2f} / {s['rtt_ms_p99']:.2f}")
        lines.append(
            f"| {label} | {s['samples_per_s']:,.0f} | {fmt(s['samples_per_s_ratio'], '.2f')} | "
            f"{fmt(s['nodes_samples_per_s'], ',.0f')} | {ttt} | "
            f"{fmt(s['time_to_target_ratio'], '.2f')} | "
            f"{fmt(s['bytes_per_sample'], ',.0f')} | {fmt(s['server_busy'], '.1f', 100, '%')} | "
            f"{fmt(s['pushes_per_s'], ',.0f')} | {rtt} | {fmt(s['stalled_s'], '.2f')} | "
            f"{fmt(s['startup_s'], '.1f')} | {fmt(s['final_accuracy'], '.1f', 100, '%')} |")
    return "\n".join(lines)


# ------------------------------------------------------------- projection

def project(per_core_samples_per_s: float, batch_size: int, num_params: int,
            server_cpu_s_per_push: float, nodes: int, cores_per_node: int = CORES_PER_NODE,
            ks: tuple[int, ...] = PROJECTED_K, link_bytes_per_s: float = LINK_BYTES_PER_S,
            limit: float = BUSY_LIMIT) -> dict:
    """What `nodes` nodes of `cores_per_node` cores would ask of one
    parameter server, for each K (updates a node applies between exchanges).

    Assumptions: every core trains at per_core_samples_per_s (samples/s,
    measured on one machine: the threaded engine scales linearly with cores,
    and the nodes never stall for an exchange); one server; no compression:
    an exchange moves num_params float32 values in (the push) and as many
    out (the pull), each direction on its own link of link_bytes_per_s
    (bytes/s); the server spends server_cpu_s_per_push CPU seconds (on one
    core, under its lock) per push, as measured here.

    Returns the cluster's samples/s and updates/s; per K the pushes/s the
    server receives and its network and CPU utilisation (fractions of the
    link each way and of one core; above 1: it cannot keep up); the smallest
    K of `ks` that keeps both below `limit` (None: none does), and the exact
    K both reach `limit` at (k_at_limit: any larger K stays below it).
    """
    samples_per_s = per_core_samples_per_s * nodes * cores_per_node
    updates_per_s = samples_per_s / batch_size
    bytes_per_push = num_params * BYTES_PER_PARAM  # each way
    rows = []
    for k in ks:
        pushes_per_s = updates_per_s / k
        rows.append({"k": k, "pushes_per_s": pushes_per_s,
                     "network_busy": pushes_per_s * bytes_per_push / link_bytes_per_s,
                     "cpu_busy": pushes_per_s * server_cpu_s_per_push})
    fitting = [r["k"] for r in rows if r["network_busy"] < limit and r["cpu_busy"] < limit]
    seconds_per_push = max(bytes_per_push / link_bytes_per_s, server_cpu_s_per_push)
    return {"nodes": nodes, "cores_per_node": cores_per_node, "samples_per_s": samples_per_s,
            "updates_per_s": updates_per_s, "bytes_per_exchange": 2 * bytes_per_push,
            "rows": rows, "smallest_k": fitting[0] if fitting else None,
            "k_at_limit": updates_per_s * seconds_per_push / limit}


def projection(args: argparse.Namespace, runs: dict[str, list[dict]], summary: dict,
               num_params: int) -> dict | None:
    """project() at PROJECTED_NODES from this invocation's measurements:
    the threaded engine's samples/s per thread (one thread per core) and the
    server's busy seconds per push over every Ray run. None without pushes."""
    pushes = sum(r["pushes"] or 0 for rs in runs.values() for r in rs)
    busy_s = sum(r["server_busy_s"] or 0.0 for rs in runs.values() for r in rs)
    if not pushes:
        return None
    per_core = summary[f"threads-{THREADS}"]["samples_per_s"] / THREADS
    return {
        "per_core_samples_per_s": per_core, "server_cpu_s_per_push": busy_s / pushes,
        "num_params": num_params, "batch_size": args.batch_size,
        "link_bytes_per_s": LINK_BYTES_PER_S, "busy_limit": BUSY_LIMIT,
        "assumptions": ("the threaded engine's samples/s per core measured here scales "
                        "linearly to every core of every node, and nodes never stall for an "
                        "exchange; one parameter server; no compression: an exchange moves "
                        f"the {num_params:,} float32 parameters in (push) and out (pull), each "
                        "way on its own 10 GbE link (1.25 GB/s); the server's CPU seconds per "
                        "push are its busy seconds (apply and reply copy under its lock) per "
                        "push in this invocation's Ray runs, on one core, Ray's "
                        "(de)serialisation not included, its one-time kernel load at its first "
                        "push included (which dominates a short run's, e.g. --quick's)"),
        "clusters": [project(per_core, args.batch_size, num_params, busy_s / pushes, n)
                     for n in PROJECTED_NODES],
    }


def projection_text(proj: dict) -> str:
    """The projection as markdown: the inputs and assumptions, a table per
    cluster size."""
    lines = ["## Projection on paper", "",
             f"Inputs: {proj['per_core_samples_per_s']:,.0f} samples/s per core (threaded "
             f"engine), {proj['num_params']:,} parameters "
             f"({2 * BYTES_PER_PARAM * proj['num_params'] / 1e6:.2f} MB per exchange, push and "
             f"pull), {1e6 * proj['server_cpu_s_per_push']:,.0f} us of server CPU per push, "
             f"b={proj['batch_size']}.", "",
             f"Assumptions: {proj['assumptions']}."]
    for c in proj["clusters"]:
        smallest = (f"K = {c['smallest_k']}" if c["smallest_k"] is not None
                    else f"none of {', '.join(str(r['k']) for r in c['rows'])}")
        lines += ["", f"**{c['nodes']} nodes x {c['cores_per_node']} cores, 10 GbE**: "
                      f"{c['samples_per_s']:,.0f} samples/s, {c['updates_per_s']:,.0f} "
                      f"updates/s. Smallest K keeping the server below "
                      f"{100 * proj['busy_limit']:.0f}% busy (network and CPU): {smallest} "
                      f"(exactly: K > {c['k_at_limit']:,.0f}).", "",
                  "| K | pushes/s | server network (each way) | server CPU |",
                  "|---:|---:|---:|---:|"]
        lines += [f"| {r['k']} | {r['pushes_per_s']:,.1f} | {100 * r['network_busy']:.1f}% | "
                  f"{100 * r['cpu_busy']:.1f}% |" for r in c["rows"]]
    return "\n".join(lines)


# ------------------------------------------------------------------- main

def load_data(args: argparse.Namespace):
    if args.quick:
        return datasets.synthetic(seed=0, n_train=2000, n_test=300)
    return datasets.load(args.dataset, args.data_dir, args.archive)


def main(argv: list[str] | None = None) -> dict:
    """Run every configuration, print the table (and the projection), write
    <out-dir>/<name>.json and .md; returns the JSON document."""
    args = parse_args(argv)
    out = Path(args.out_dir) / args.name
    out.parent.mkdir(parents=True, exist_ok=True)
    data = load_data(args)
    model = models.build(args.model, args.dataset)
    t0 = time.perf_counter()
    with local_ray():
        runs = run_all(args, model, data)
    base = summarise(runs[f"threads-{THREADS}"], None)
    summary = {label: summarise(rs, base) for label, rs in runs.items()}
    text = "\n\n".join([table(summary, args.target), *stall_warnings(summary, runs)])
    proj = projection(args, runs, summary, model.num_params) if args.project else None
    if proj is not None:
        text += "\n\n" + projection_text(proj)
    print(text)
    document = {"options": vars(args), "machine": results.machine_info(),
                "date": time.strftime("%Y-%m-%d"), "seconds": time.perf_counter() - t0,
                "num_params": model.num_params, "summary": summary, "projection": proj,
                "runs": runs}
    files.write_json_atomic(out.with_suffix(".json"), document)
    with files.replacing(out.with_suffix(".md")) as tmp:
        tmp.write_text(text + "\n")
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")
    return json.loads(out.with_suffix(".json").read_text())  # as the file holds it


@contextmanager
def local_ray() -> Iterator[None]:
    """Unless this process has joined a Ray cluster already: the Ray runs
    start a new one on this machine (RAY_ADDRESS=local, where not set:
    without it ray.init joins the cluster a `ray start` or a test left
    running here, and refuses to, being given num_cpus), shut down at the
    end, so that no idle Ray is left to disturb what runs next."""
    try:
        import ray
    except ImportError:  # the Ray runs say so
        yield
        return
    if ray.is_initialized():
        yield
        return
    before = os.environ.get("RAY_ADDRESS")
    os.environ.setdefault("RAY_ADDRESS", "local")
    try:
        yield
    finally:
        if before is None:
            del os.environ["RAY_ADDRESS"]
        ray.shutdown()


if __name__ == "__main__":
    main()
