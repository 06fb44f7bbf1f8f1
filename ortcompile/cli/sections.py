"""`--help` in sections: ~45 options read as a few groups by what they decide, not one flat wall.

A command made with `cls=SectionedCommand` lists its options under the titles of SECTIONS, in that order; an option
no section names goes under "Other options", so a new option is never hidden, only unsorted (tests/test_cli.py
checks that compile's help has none there).
"""

from __future__ import annotations

import click

# Section title -> the options it holds, by their first long name.
SECTIONS: dict[str, tuple[str, ...]] = {
    "Output": ("--output", "--output-dir", "--force", "--if-changed", "--depfile", "--stitch-output", "--replace-stitched"),
    "Execution provider": ("--ep", "--ep-option", "--target", "--ep-library"),
    "Shapes and graph": ("--fix-dim", "--fix-shape", "--freeze", "--prepare"),
    "File layout": ("--inline-threshold", "--align", "--align-threshold", "--shard-size", "--embed"),
    "Large models: parts": ("--partition", "--max-context-size", "--jobs", "--memory-budget"),
    "Batches": ("--share-weights",),
    "Checking before publishing": ("--check", "--require-compiled", "--require-full", "--verify", "--input", "--inputs",
                                   "--precision", "--rtol", "--atol", "--min-snr", "--min-cosine", "--min-top1"),
    "When the NPU computes something else": ("--cpu-nodes", "--fallback"),
    "Settings files": ("--config", "--no-config"),
    "Messages": ("--quiet", "--verbose", "--json", "--debug", "--help"),
}
OTHER = "Other options"


def long_name(param: click.Parameter) -> str:
    """The option's first long name (`--output` for `-o, --output, --output-dir`), or its first name."""
    return next((opt for opt in param.opts if opt.startswith("--")), param.opts[0] if param.opts else param.name or "")


def sectioned(params: list[click.Parameter], ctx: click.Context) -> list[tuple[str, list[tuple[str, str]]]]:
    """(title, help records) per section that has options, in SECTIONS' order, "Other options" last."""
    records: dict[str, list[tuple[str, str]]] = {title: [] for title in [*SECTIONS, OTHER]}
    where = {name: title for title, names in SECTIONS.items() for name in names}
    for param in params:
        if isinstance(param, click.Argument):  # named in the usage line
            continue
        record = param.get_help_record(ctx)
        if record is not None:
            records[where.get(long_name(param), OTHER)].append(record)
    return [(title, rows) for title, rows in records.items() if rows]


class SectionedCommand(click.Command):
    """A click command whose --help lists its options in sections."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        for title, rows in sectioned(self.get_params(ctx), ctx):
            with formatter.section(title):
                formatter.write_dl(rows)
