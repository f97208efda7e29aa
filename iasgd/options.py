"""Options declared once, as dataclass fields.

`option()` declares a field together with everything its command-line flag
needs (help, group, choices, metavar, parser, default text); `add_options()`
makes the flags of any such dataclasses, field `a_b` as `--a-b`. The parsers
below check one value each; argparse shows their ArgumentTypeError as one
line that names the flag.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


class UsageError(Exception):
    """Invalid command-line input; the message is one line that says what to do."""


@dataclass(frozen=True)
class Applies:
    """Where an option has an effect: `words` says it, with fields as
    `{field}` (shown as `field` in Python and `--field` on the command line),
    and `test(run)` tells it from a run's values (any object with the fields
    as attributes). An option set where it has no effect is refused; `fix`
    says what to do then, `{option}` standing for the option refused (empty:
    remove it)."""

    words: str
    test: Callable[[Any], bool]
    fix: str = ""


def option(default: Any, help: str, *, group: str, choices: Iterable[str] | None = None,
           metavar: str | None = None, parse: Callable[[str], Any] | None = None,
           default_text: str | None = None, applies: Applies | None = None) -> Any:
    """A dataclass field defaulting to `default`, with its flag: `help` (plain
    text), the --help `group` it is listed in, the allowed `choices`, its
    `metavar`, `parse` (text to value; ArgumentTypeError if invalid; None:
    the text itself), `default_text`, what --help says the default is when
    the default itself (None) says nothing, and where it `applies` (None:
    every run). A bool field is a flag that sets it."""
    metadata = {"help": help, "group": group, "metavar": metavar, "parse": parse,
                "choices": None if choices is None else tuple(choices),
                "default_text": default_text, "applies": applies}
    return dataclasses.field(default=default, metadata=metadata)


def flag(name: str) -> str:
    """The flag of field `name`: a_b -> --a-b."""
    return "--" + name.replace("_", "-")


FIELD = re.compile(r"\{([a-z0-9_]+)\}")


def as_fields(template: str) -> str:
    """A text with `{field}` placeholders, fields named as in Python."""
    return FIELD.sub(lambda m: m.group(1), template)


def as_flags(template: str) -> str:
    """A text with `{field}` placeholders, fields named as flags."""
    return FIELD.sub(lambda m: flag(m.group(1)), template)


def applies(f: dataclasses.Field) -> Applies | None:
    """Where the option of field `f` has an effect (None: every run)."""
    return f.metadata.get("applies")


def does_nothing(name: str, rule: Applies) -> str:
    """The message, as a template, for field `name` set where `rule` says it
    has no effect."""
    fix = (rule.fix or "remove {option}").replace("{option}", f"{{{name}}}")
    return f"{{{name}}} applies to {rule.words} only, so it would do nothing here; {fix}"


def inapplicable(cls: type, run: Any, names: Iterable[str]) -> tuple[str, Applies] | None:
    """The first of the fields `names` of dataclass `cls` whose option has no
    effect on `run` (any object with the fields as attributes), with its
    rule; None if each has one."""
    rules = {f.name: applies(f) for f in dataclasses.fields(cls)}
    for name in names:
        rule = rules.get(name)
        if rule is not None and not rule.test(run):
            return name, rule
    return None


def add_options(parser: argparse.ArgumentParser, *classes: type,
                groups: Iterable[str] = ()) -> None:
    """Add one flag per field of the dataclasses `classes`, each field declared
    with option(), in argument groups: those of `groups` first, in that order,
    then any others as their fields come."""
    members: dict[str, list[dataclasses.Field]] = {title: [] for title in groups}
    for cls in classes:
        for f in dataclasses.fields(cls):
            if "group" not in f.metadata:  # a field without a flag would get its default silently
                raise TypeError(f"{cls.__name__}.{f.name} is not declared with option()")
            members.setdefault(f.metadata["group"], []).append(f)
    for title, fields in members.items():
        group = parser.add_argument_group(title)  # --help leaves out an empty one
        for f in fields:
            _add(group, f)


def _add(group: argparse._ArgumentGroup, f: dataclasses.Field) -> None:
    meta = f.metadata
    if isinstance(f.default, bool):
        if f.default:
            raise TypeError(f"{f.name}: a bool option defaults to False (its flag sets it)")
        group.add_argument(flag(f.name), action="store_true", help=_help(f))
    else:
        group.add_argument(flag(f.name), default=f.default, type=meta["parse"],
                           choices=meta["choices"], metavar=meta["metavar"], help=_help(f))


def _help(f: dataclasses.Field) -> str:
    """The help with one default: the default text, else the default itself
    unless it is None or a flag's."""
    shown = f.metadata["default_text"]
    if shown is None and f.default is not None and not isinstance(f.default, bool):
        shown = f.default
    text = f.metadata["help"] if shown is None else f"{f.metadata['help']} (default: {shown})"
    return text.replace("%", "%%")  # argparse %-formats help; ours is plain text


def positive_int(text: str) -> int:
    """An integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def nonneg_int(text: str) -> int:
    """An integer >= 0."""
    value = integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def integer(text: str) -> int:
    """Any integer."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _finite_float(text: str, *, low: float, strict: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value < low or (strict and value == low):
        bound = f"> {low:g}" if strict else f">= {low:g}"
        raise argparse.ArgumentTypeError(f"must be a finite number {bound}, got {text}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0."""
    return _finite_float(text, low=0.0, strict=True)


def nonneg_float(text: str) -> float:
    """A finite number >= 0."""
    return _finite_float(text, low=0.0, strict=False)


def below_one(text: str) -> float:
    """A number in [0, 1)."""
    value = _finite_float(text, low=0.0, strict=False)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


def unit_float(text: str) -> float:
    """A number in [0, 1]."""
    value = _finite_float(text, low=0.0, strict=False)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return value


def widths(text: str) -> tuple[int, ...]:
    """Comma-separated positive integers: 128,128,128 -> (128, 128, 128)."""
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated positive integers like 128,128,128, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"widths must be positive, got {text!r}")
    return values
