"""One source for every option: the flags of `python -m iasgd.run` are made
from the fields of TrainConfig and RunOptions, with their defaults, and
--help and docs/cli.md say each default once."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from iasgd import options as O
from iasgd import run
from iasgd.algorithms import VARIANTS
from iasgd.config import TRAINING, ConfigError, TrainConfig
from iasgd.options import option

CLASSES = (TrainConfig, run.RunOptions)
DOCS = Path(__file__).resolve().parents[1] / "docs" / "cli.md"


def option_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]


def shown_default(f: dataclasses.Field) -> str | None:
    """What --help should say the default of field `f` is; None: nothing."""
    if isinstance(f.default, bool):
        return None
    if f.metadata["default_text"] is not None:
        return f.metadata["default_text"]
    return None if f.default is None else str(f.default)


def help_entries(text: str) -> dict[str, str]:
    """--help's text of each option, by its first flag, on one line."""
    entries: dict[str, str] = {}
    flag = None
    for line in text.splitlines():
        if m := re.match(r"  (-[^\s,]+)", line):
            flag = m.group(1)
            entries[flag] = line.strip()
        elif flag is not None and line.startswith("   "):
            entries[flag] += " " + line.strip()
        else:
            flag = None
    return entries


def test_each_field_has_exactly_one_flag_and_each_flag_is_a_field():
    names = [f.name for cls in CLASSES for f in dataclasses.fields(cls)]
    assert len(names) == len(set(names))  # no field in both
    actions = option_actions(run.build_parser())
    assert sorted(a.dest for a in actions) == sorted(names)
    for a in actions:
        assert a.option_strings == [O.flag(a.dest)]


def test_parser_defaults_are_the_dataclass_defaults():
    args = run.build_parser().parse_args([])
    assert run.train_config(args) == TrainConfig()
    assert {f.name: getattr(args, f.name) for f in dataclasses.fields(run.RunOptions)} == (
        dataclasses.asdict(run.RunOptions()))
    assert set(vars(args)) == {f.name for cls in CLASSES for f in dataclasses.fields(cls)}


def test_train_config_takes_every_field_and_drops_none():
    args = run.build_parser().parse_args(["--lr", "0.1", "--algo", "interval", "--threads", "2",
                                          "--interval-schedule", "decay", "--y0", "8"])
    cfg = run.train_config(args)
    assert cfg.lr == 0.1 and cfg.y0 == 8
    del args.node_gate
    with pytest.raises(AttributeError, match="node_gate"):
        run.train_config(args)


def test_help_says_each_default_once(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    text = run.build_parser().format_help()
    flat = " ".join(text.split())
    assert "(default: False)" not in flat and "(default: None)" not in flat
    assert "this machine's cores" not in flat
    entries = help_entries(text)
    assert "--batch-size" in entries and "--resume" in entries
    for entry in entries.values():
        assert entry.count("default") <= 1, entry
    for cls in CLASSES:
        for f in dataclasses.fields(cls):
            entry = entries[O.flag(f.name)]
            shown = shown_default(f)
            if shown is None:
                assert "default" not in entry, entry
            else:
                assert entry.endswith(f"(default: {shown})"), entry


def test_help_shows_the_examples_and_exit_codes():
    epilog = run.build_parser().epilog
    assert "python -m iasgd.run --resume " in epilog
    codes = [0, *(value for name, value in vars(run).items() if name.startswith("EXIT_")
                  and isinstance(value, int))]
    assert len(codes) == 6
    for code in codes:
        assert re.search(rf"^  {code} +\S", epilog, re.MULTILINE), code


@pytest.mark.parametrize(("argv", "message"), [
    (["--threads", "x"], "argument --threads: expected a positive integer, got 'x'"),
    (["--threads", "0"], "argument --threads: must be a positive integer, got 0"),
    (["--momentum", "1"], "argument --momentum: must be in [0, 1), got 1"),
    (["--lr", "0"], "argument --lr: must be a finite number > 0, got 0"),
    (["--tail-amplitude", "2"], "argument --tail-amplitude: must be in [0, 1], got 2"),
    (["--checkpoint-every", "-1"], "argument --checkpoint-every: must be >= 0, got -1"),
    (["--seed", "1.5"], "argument --seed: expected an integer, got '1.5'"),
    (["--hidden", "4,0"], "argument --hidden: widths must be positive, got '4,0'"),
    (["--gate", "maybe"], "argument --gate: invalid choice: 'maybe'"),
    (["--quiet", "yes"], "unrecognized arguments: yes"),
    (["--epoch", "3"], "unrecognized arguments: --epoch 3"),  # no abbreviations
])
def test_bad_values_are_one_line_naming_the_flag(argv, message):
    with pytest.raises(run.UsageError) as error:
        run.build_parser().parse_args(argv)
    assert str(error.value).startswith(message)


@dataclasses.dataclass(frozen=True)
class MoreOptions(run.RunOptions):
    """RunOptions with two more fields, declared as any other."""

    warmup: int = option(100, "steps of linear warm-up", group="warm-up", metavar="STEPS",
                         parse=O.positive_int)
    verbose: bool = option(False, "say more", group=TRAINING)


def test_a_new_field_gets_its_flag_without_touching_the_parser(monkeypatch):
    monkeypatch.setattr(run, "RunOptions", MoreOptions)
    parser = run.build_parser()
    args = parser.parse_args(["--warmup", "7", "--verbose", "--threads", "3"])
    assert (args.warmup, args.verbose, args.threads) == (7, True, 3)
    assert parser.parse_args([]).warmup == 100
    with pytest.raises(run.UsageError, match="argument --warmup: must be a positive integer"):
        parser.parse_args(["--warmup", "0"])
    entries = help_entries(parser.format_help())
    assert entries["--warmup"].endswith("steps of linear warm-up (default: 100)")
    assert entries["--verbose"].endswith("say more")
    titles = [g.title for g in parser._action_groups if g._group_actions]
    assert titles[-1] == "warm-up"  # a group not in run.GROUPS comes after those


def test_any_dataclass_of_options_makes_a_parser_and_a_bare_field_is_refused():
    @dataclasses.dataclass(frozen=True)
    class Knobs:
        rate: float = option(0.5, "a rate", group="knobs", parse=O.unit_float)
        mode: str = option("a", "a mode", group="knobs", choices=("a", "b"))

    parser = argparse.ArgumentParser()
    O.add_options(parser, Knobs)
    assert Knobs(**vars(parser.parse_args(["--rate", "1", "--mode", "b"]))) == Knobs(1.0, "b")

    @dataclasses.dataclass(frozen=True)
    class Bare:
        size: int = 3

    with pytest.raises(TypeError, match=r"Bare\.size is not declared with option"):
        O.add_options(argparse.ArgumentParser(), Bare)


def docs_rows() -> dict[str, list[str]]:
    """docs/cli.md's option tables: the cells of each row, by its flag."""
    rows = {}
    for line in DOCS.read_text().splitlines():
        if line.startswith("| `--"):
            cells = [cell.strip() for cell in line.strip("|").split("|", 3)]
            rows[cells[0].strip("`").split()[0]] = cells
    return rows


def test_docs_list_every_option_as_the_parser_has_it():
    rows = docs_rows()
    parser = run.build_parser()
    assert sorted(rows) == sorted(a.option_strings[0] for a in option_actions(parser))
    fields = {f.name: f for cls in CLASSES for f in dataclasses.fields(cls)}
    for a in option_actions(parser):
        usage = a.option_strings[0]
        if a.nargs != 0:
            usage += " " + (a.metavar or ("{" + ",".join(a.choices) + "}" if a.choices
                                          else a.dest.upper()))
        option_cell, default_cell, applies_cell, _ = rows[a.option_strings[0]]
        assert option_cell == f"`{usage}`"
        shown = shown_default(fields[a.dest])
        expected = "off" if a.nargs == 0 else shown or ""
        assert default_cell.replace("`", "") == expected, a.dest
        rule = O.applies(fields[a.dest])
        assert applies_cell == ("every run" if rule is None else O.as_flags(rule.words)), a.dest


# The table walk: every option that is not for every run, set beside runs
# where its rule holds and where it does not. A value for each, valid
# wherever the option applies (on the command line, as text).
SETTINGS = {"threads": "2", "interval": "8", "gate": "drop", "y0": "20", "y_min": "2",
            "decay_every": "10", "decay_by": "2", "probe_offset": "8", "probe_step": "2",
            "probe_steps": "10", "exec_steps": "10", "probe_loss_scale": "0.5",
            "staleness_budget": "0.3", "loss_window": "10", "window": "4", "m0": "2",
            "tail_amplitude": "0.5", "nodes": "3", "sync_every": "4", "node_interval": "3",
            "node_gate": "drop", "interval_schedule": "decay", "threads_schedule": "window",
            "lr_schedule": "inverse", "nesterov": None,  # None: a flag
            "lr_decay": "cosine", "lr_warmup": "0.1", "crop_padding": "2"}
RUNS = [[], ["--momentum", "0"], ["--augment", "flip"], ["--augment", "crop"],
        ["--augment", "crop,flip"], ["--algo", "hogwild", "--threads", "2"],
        ["--algo", "interval", "--threads", "2"],
        *(["--algo", "interval", "--threads", "2", "--interval-schedule", schedule]
          for schedule in ("decay", "probe", "follow-loss", "per-worker", "budget")),
        ["--algo", "async", "--threads", "2", "--threads-schedule", "window"],
        ["--algo", "hogwild", "--threads", "2", "--lr-schedule", "tail"],
        ["--algo", "interval", "--threads", "2", "--backend", "ray"],
        ["--algo", "hogwild", "--threads", "2", "--backend", "ray"]]
TRAINING_RULES = {f.name: O.applies(f) for f in dataclasses.fields(TrainConfig) if O.applies(f)}


def as_config(argv: list[str]) -> TrainConfig:
    return run.train_config(run.build_parser().parse_args(argv))


def test_every_option_with_a_rule_has_a_setting_to_walk():
    assert set(TRAINING_RULES) == set(SETTINGS)


@pytest.mark.parametrize("base", RUNS, ids=[" ".join(r) or "sequential" for r in RUNS])
def test_each_training_option_is_refused_exactly_where_it_does_nothing(base, tmp_path,
                                                                     monkeypatch):
    monkeypatch.chdir(tmp_path)
    base_cfg = as_config(base)
    for name, rule in TRAINING_RULES.items():
        if name in run.given_options(base):
            continue
        value = [] if SETTINGS[name] is None else [SETTINGS[name]]
        argv = [*base, O.flag(name), *value]
        fields = {**{k: getattr(base_cfg, k) for k in run.given_options(base)},
                  name: getattr(run.build_parser().parse_args(argv), name)}
        message = f"applies to {rule.words} only"
        if rule.test(base_cfg):
            TrainConfig(**fields)  # the API takes it
            cfg, _, _ = run.command_line(["--dataset", "synthetic", *argv])
            assert getattr(cfg, name) == fields[name]
        else:
            with pytest.raises(ConfigError) as refused:
                TrainConfig(**fields)
            assert str(refused.value).startswith(f"{name} {O.as_fields(message)}")
            with pytest.raises(run.UsageError) as refused:
                run.command_line(["--dataset", "synthetic", *argv])
            assert str(refused.value).startswith(f"{O.flag(name)} {O.as_flags(message)}")


def test_a_given_flag_that_does_nothing_is_refused_even_at_its_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(run.UsageError, match="--gate applies to --algo interval only"):
        run.command_line(["--dataset", "synthetic", "--algo", "hogwild", "--threads", "2",
                          "--gate", "wait"])
    assert TrainConfig(algo="hogwild", threads=2, gate="wait").gate == "wait"  # unseen there


RUN_OPTION_CASES = [  # (flags, runs where they apply, runs where they do not)
    (["--sim-cores", "2"], [["--simulate", "--algo", "hogwild", "--threads", "2"]], [[]]),
    (["--sim-snapshot-reads"], [["--simulate", "--algo", "hogwild", "--threads", "2"]], [[]]),
    (["--test-fraction", "0.2"], [["--dataset", "mine.npz"]], [["--dataset", "synthetic"]]),
    (["--layout", "nhwc"], [["--dataset", "mine.npz"]], [["--dataset", "synthetic"]]),
    (["--archive", "."], [["--dataset", "cifar10"]], [["--dataset", "synthetic"]]),
    (["--hidden", "8"], [["--model", "mlp"]], [[]]),
    (["--checkpoint-every", "1"], [[]], [["--simulate", "--algo", "hogwild", "--threads", "2"]]),
    (["--no-checkpoint"], [[]], [["--simulate", "--algo", "hogwild", "--threads", "2"]]),
    (["--address", "auto"], [["--backend", "ray", "--algo", "hogwild", "--threads", "2"]],
     [[]]),
]


@pytest.mark.parametrize(("flags", "on", "off"), RUN_OPTION_CASES,
                         ids=[c[0][0] for c in RUN_OPTION_CASES])
def test_each_run_option_is_refused_exactly_where_it_does_nothing(flags, on, off, tmp_path,
                                                                  monkeypatch):
    monkeypatch.chdir(tmp_path)
    rule = O.applies({f.name: f for f in dataclasses.fields(run.RunOptions)}[
        flags[0][2:].replace("-", "_")])
    for base in on:
        run.command_line(["--dataset", "synthetic", *base, *flags])
    for base in off:
        with pytest.raises(run.UsageError) as refused:
            run.command_line(["--dataset", "synthetic", *base, *flags])
        assert str(refused.value) == (f"{flags[0]} applies to {O.as_flags(rule.words)} only, "
                                      f"so it would do nothing here; remove {flags[0]}")


def test_the_api_refuses_what_the_command_line_refuses():
    for fields, field in [({"threads": 5000, "algo": "hogwild"}, "threads"),
                          ({"seed": -3}, "seed"),
                          ({"algo": "hogwild", "threads": 2, "gate": "drop"}, "gate")]:
        with pytest.raises(ConfigError) as api:
            TrainConfig(**fields)
        argv = [x for k, v in fields.items() for x in (O.flag(k), str(v))]
        with pytest.raises(run.UsageError) as cli:
            run.command_line(["--dataset", "synthetic", *argv])
        assert str(api.value).split()[0] == field
        assert api.value.for_cli() == str(cli.value) or str(cli.value).startswith(
            f"argument {O.flag(field)}")


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_a_variant_sets_its_fields_by_name_and_is_recorded(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    threads = [] if name == "sequential" else ["--threads", "4"]
    cfg, opts, _ = run.command_line(["--dataset", "synthetic", "--variant", name, *threads])
    for field, value in VARIANTS[name].items():
        assert getattr(cfg, field) == value
    assert TrainConfig(variant=name, threads=cfg.threads) == cfg
    assert run.run_config(cfg, opts, run.models.build(opts.model, opts.dataset))["variant"] == name


def test_a_flag_beside_a_variant_may_repeat_it_but_not_change_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    base = ["--dataset", "synthetic", "--variant", "interval-budget", "--threads", "8"]
    cfg, _, _ = run.command_line([*base, "--lr-schedule", "tail", "--lr", "0.01"])
    assert (cfg.lr_schedule, cfg.lr, cfg.interval) == ("tail", 0.01, 32)
    for flags in (["--lr-schedule", "none"], ["--interval", "16"], ["--algo", "hogwild"]):
        with pytest.raises(run.UsageError, match=f"{flags[0]} {flags[1]} contradicts it"):
            run.command_line([*base, *flags])
    with pytest.raises(ConfigError, match="lr_schedule inverse contradicts it"):
        TrainConfig(variant="interval-budget", lr_schedule="inverse")


def test_a_sweeps_knobs_apply_where_they_can():
    from iasgd.config import config_where_it_applies

    knobs = {"interval": 8, "gate": "drop", "staleness_budget": 0.3, "lr": 0.01}
    assert config_where_it_applies(algo="hogwild", threads=2, **knobs) == TrainConfig(
        algo="hogwild", threads=2, lr=0.01)
    assert config_where_it_applies(algo="interval", threads=2, **knobs) == TrainConfig(
        algo="interval", threads=2, interval=8, gate="drop", lr=0.01)


def test_a_sweeps_knobs_apply_to_what_a_variant_makes_of_the_run():
    """A variant names its algorithm: the knobs are judged against that
    algorithm, not against the default sequential one (which would drop the
    thread count and every gate knob)."""
    from iasgd.config import config_where_it_applies

    cfg = config_where_it_applies(variant="interval-decay", threads=8, y0=8, decay_every=16,
                                  window=4)
    assert cfg == TrainConfig(variant="interval-decay", threads=8, y0=8, decay_every=16)
    assert (cfg.algo, cfg.threads, cfg.interval_schedule) == ("interval", 8, "decay")
