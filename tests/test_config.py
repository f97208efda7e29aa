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
from iasgd.config import TRAINING, TrainConfig
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
    args = run.build_parser().parse_args(["--lr", "0.1", "--y0", "8"])
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
            cells = [cell.strip() for cell in line.strip("|").split("|", 2)]
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
        option_cell, default_cell, _ = rows[a.option_strings[0]]
        assert option_cell == f"`{usage}`"
        shown = shown_default(fields[a.dest])
        expected = "off" if a.nargs == 0 else shown or ""
        assert default_cell.replace("`", "") == expected, a.dest
