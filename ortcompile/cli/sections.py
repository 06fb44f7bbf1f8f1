"""`--help` in sections: ~45 options read as a few groups by what they decide, not one flat wall.

A command made with `cls=SectionedCommand` lists its options under the titles of SECTIONS, in that order (an option
of the option table, ortcompile/optiontable.py, under its record's section); an option no section names goes under
"Other options", so a new option is never hidden, only unsorted (tests/test_cli.py checks that compile's help has
none there).
"""

from __future__ import annotations

from collections.abc import Iterable

import click

from ortcompile.optiontable import TABLE, Option

TITLES = ("Output", "Execution provider", "Shapes and graph", "File layout", "Large models: parts", "Batches",
          "Checking before publishing", "When the NPU computes something else", "Settings files", "Messages")
# The options not in the option table (other commands' own, every command's messages), by section title.
NOT_IN_TABLE: dict[str, tuple[str, ...]] = {"Output": ("--output-dir", "--stitch-output", "--replace-stitched"),
                                            "Messages": ("--quiet", "--verbose", "--json", "--debug", "--help")}


def sections_of(table: Iterable[Option]) -> dict[str, tuple[str, ...]]:
    """Section title -> the options it holds, by their first long name: the table's by their `section`, then the rest."""
    entries = list(table)
    return {title: (*(o.long_name for o in entries if o.section == title), *NOT_IN_TABLE.get(title, ())) for title in TITLES}


SECTIONS = sections_of(TABLE)
OTHER = "Other options"


def long_name(param: click.Parameter) -> str:
    """The option's first long name (`--output` for `-o, --output, --output-dir`), or its first name."""
    return next((opt for opt in param.opts if opt.startswith("--")), param.opts[0] if param.opts else param.name or "")


def sectioned(params: list[click.Parameter], ctx: click.Context,
              sections: dict[str, tuple[str, ...]] = SECTIONS) -> list[tuple[str, list[tuple[str, str]]]]:
    """(title, help records) per section that has options, in SECTIONS' order, "Other options" last."""
    records: dict[str, list[tuple[str, str]]] = {title: [] for title in [*sections, OTHER]}
    where = {name: title for title, names in sections.items() for name in names}
    for param in params:
        if isinstance(param, click.Argument):  # named in the usage line
            continue
        record = param.get_help_record(ctx)
        if record is not None:
            records[where.get(long_name(param), OTHER)].append(record)
    return [(title, rows) for title, rows in records.items() if rows]


class SectionedCommand(click.Command):
    """A click command whose --help lists its options in sections."""

    sections: dict[str, tuple[str, ...]] = SECTIONS

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        for title, rows in sectioned(self.get_params(ctx), ctx, self.sections):
            with formatter.section(title):
                formatter.write_dl(rows)
