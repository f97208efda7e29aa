"""iasgd.sweeps, the one definition of bench/scaling.py's sweep file: a sweep
written by it reads back equal, every committed sweep reads, older records
get their lr and seed, and a file that is not a sweep is one line that says
what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from iasgd import sweeps

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"

seconds = st.floats(0, 1e4, allow_nan=False)
accuracy = st.none() | st.floats(0, 1)
records = st.fixed_dictionaries({
    "lr": st.sampled_from([0.005, 0.01, 0.02]),
    "seed": st.integers(0, 9),
    "samples_per_s": seconds,
    "staleness_mean": seconds,
    "staleness_max": st.integers(0, 1023),
    "staleness_hist": st.lists(st.integers(0, 10**9), max_size=8),
    "acceptance_rate": st.floats(0, 1),
    "final_accuracy": accuracy,
    "status": st.sampled_from(["completed", "time_budget", "diverged", "interrupted"]),
    "eval_time_s": seconds,
    "curve": st.lists(st.tuples(seconds, accuracy).map(list), max_size=4),
    "evals": st.lists(st.tuples(seconds, st.integers(0, 10**6), accuracy).map(list),
                      max_size=4),
    "time_to_target_s": st.dictionaries(st.sampled_from(["0.5", "0.55"]), st.none() | seconds),
})
documents = st.fixed_dictionaries({
    "options": st.fixed_dictionaries({"threads": st.lists(st.integers(1, 256), max_size=3),
                                      "lrs": st.lists(st.floats(1e-4, 1), max_size=2),
                                      "dataset": st.sampled_from(["cifar10", "synthetic"])}),
    "simulated": st.booleans(),
    "runs": st.dictionaries(st.sampled_from(list(sweeps.ALGOS)),
                            st.dictionaries(st.integers(1, 256).map(str),
                                            st.lists(records, max_size=3), max_size=3),
                            max_size=3),
})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(doc=documents)
def test_a_written_sweep_reads_back_equal(tmp_path, doc):
    path = tmp_path / "sweep.json"
    sweeps.write(path, doc)
    assert sweeps.read(path, sweeps.PLOTTED + sweeps.REPORTED) == {"version": sweeps.VERSION,
                                                                   **doc}
    assert not [p for p in tmp_path.iterdir() if p != path]  # no temporary left behind


def test_a_record_holds_what_its_results_document_says():
    doc = {"samples_per_s": 900.0, "acceptance_rate": 0.75, "final_test_accuracy": 0.5,
           "status": "completed", "eval_time_s": 0.25, "evals": [[1.0, 10, 0.25]],
           "staleness": {"mean": 0.5, "max": 2, "hist": [3, 2, 1]},
           "epochs": [{"wall_s": 1.5, "test_accuracy": 0.5}]}
    run = sweeps.record(doc, 0.01, 2)
    assert set(run) == set(sweeps.Record.__annotations__) - {
        "time_to_target_s", "updates_to_target", "foreign_cpu"}  # set when scored and checked
    assert run["curve"] == [[1.5, 0.5]] and run["staleness_hist"] == [3, 2, 1]
    assert sweeps.accuracy_points(run) == [[1.0, 0.25]]  # the evals, when there are any
    assert sweeps.accuracy_points({**run, "evals": []}) == [[1.5, 0.5]]


def test_records_older_than_lrs_get_the_sweeps_lr_and_their_place_as_seed():
    old = [{"curve": []}, {"curve": []}]
    assert [(r["lr"], r["seed"]) for r in sweeps.tagged(old, 0.005)] == [(0.005, 0), (0.005, 1)]
    new = [{"lr": 0.01, "seed": 4}, {"lr": 0.02, "seed": 4}]
    assert sweeps.tagged(new, 0.005) == new
    assert sweeps.upgraded({"target_accuracy": 0.6, "lr": 0.01})["targets"] == [0.6]
    assert sweeps.upgraded({"lr": 0.01})["lrs"] == [0.01]
    older = sweeps.upgraded({"lr": 0.01, "time_budget": 45.0})  # before --recipe and --epochs
    assert (older["epochs"], older["recipe"], older["stop_at_target"]) == (None, None, False)


def committed() -> list[Path]:
    docs = {p: json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))}
    return [p for p, doc in docs.items() if sweeps.is_sweep(doc) and "algos" in doc["options"]]


@pytest.mark.parametrize("path", committed(), ids=lambda p: p.stem)
def test_every_committed_sweep_reads(path):
    doc = sweeps.read(path, sweeps.PLOTTED + sweeps.REPORTED)
    assert doc.get("version", 1) <= sweeps.VERSION and doc["runs"]


def test_the_committed_sweeps_are_found():
    assert len(committed()) >= 20


def good() -> dict:
    return {"options": {}, "runs": {"hogwild": {"8": [{"staleness_hist": [1, 2],
                                                       "curve": [[1.0, 0.5], [2.0, None]]}]}}}


AT = "runs[hogwild][8][0]"  # the one run of good()


def broken(change) -> dict:
    doc = good()
    change(doc, doc["runs"]["hogwild"]["8"][0])
    return doc


@pytest.mark.parametrize(("doc", "problem"), [
    ([1, 2], "not a JSON object"),
    ({"name": "x"}, "no options and runs"),
    ({"options": [], "runs": {}}, "options is not an object"),
    ({"options": {}, "runs": []}, "runs is not an object"),
    ({"options": {}, "runs": {"hogwild": [1]}}, "runs[hogwild] is not an object of thread counts"),
    ({"options": {}, "runs": {"hogwild": {"x": []}}}, "runs[hogwild][x]: x is not a thread count"),
    ({"options": {}, "runs": {"hogwild": {"8": {}}}}, "runs[hogwild][8] is not a list of runs"),
    (broken(lambda d, r: r.pop("curve")), f"{AT} has no curve"),
    (broken(lambda d, r: r.update(staleness_hist=[1.5])),
     f"{AT} staleness_hist is not a list of counts"),
    (broken(lambda d, r: r.update(curve=[[1.0]])),
     f"{AT} curve is not a list of [seconds, accuracy]"),
    (broken(lambda d, r: r.update(evals=[[1.0, "x", 0.5]])),
     f"{AT} evals is not a list of [seconds, applied, accuracy]"),
    (broken(lambda d, r: r.update(seed="0")), f"{AT} seed is not a whole number"),
    (broken(lambda d, r: d.update(version="1")), "version '1' is not a format version"),
])
def test_a_file_that_is_not_a_sweep_is_one_line_naming_what_is_wrong(tmp_path, doc, problem):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(sweeps.SweepError) as e:
        sweeps.read(path)
    assert str(e.value) == (f"{path} is not a bench/scaling.py sweep ({problem}); name the JSON "
                            "file a sweep wrote")


def test_a_newer_format_says_to_update(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({**good(), "version": sweeps.VERSION + 1}))
    with pytest.raises(sweeps.SweepError, match=r"format version 2, newer than this iasgd "
                                                r"reads \(1\); update iasgd$"):
        sweeps.read(path)


@pytest.mark.parametrize(("content", "needle"), [
    (b"{not json", "is not JSON (Expecting property name"),
    (b"\xff\xfe\x00", "cannot read it"),
])
def test_unreadable_files_are_one_line(tmp_path, content, needle):
    path = tmp_path / "s.json"
    path.write_bytes(content)
    with pytest.raises(sweeps.SweepError, match=r"^[^\n]*$") as e:
        sweeps.read(path)
    assert needle in str(e.value)


def test_the_fields_a_reader_needs_are_its_own_to_name(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(good()))
    assert sweeps.read(path)["runs"]["hogwild"]["8"][0]["staleness_hist"] == [1, 2]
    with pytest.raises(sweeps.SweepError, match="has no samples_per_s, staleness_mean"):
        sweeps.read(path, sweeps.PLOTTED + sweeps.REPORTED)
