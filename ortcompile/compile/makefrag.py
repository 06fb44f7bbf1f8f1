"""The Make fragment `ortcompile split` writes beside the parts (`<stem>.parts.mk`): one rule per part, then the stitch.

Make reads the fragment, then the shell reads each recipe Make expanded, so a name from the user (the model's, a
directory's) must mean the same to both and nothing else. Such names may hold letters, digits, spaces and
`._+,@/-`: a space is written `\\ `, which Make reads as a space inside one target name and the shell as a space
inside one word. Anything else (`$`, a backtick, a quote, `#`, `%`, `:`, `;`, `=`, `*`, `~`, a tab or a newline,
...) is syntax to Make or to the shell in some place of the fragment, so split refuses it before writing anything
(UsageError, exit 2) rather than write a fragment that runs something else.

The compile arguments (EP options and the EP library's path are the user's text) are shell-quoted, then escaped for
a Make variable (`$` as `$$`, `#` as `\\#`): Make expands nothing in them and the shell gets each one verbatim.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from ortcompile.compile.partfiles import part_name, plan_file_name
from ortcompile.errors import UsageError
from ortcompile.naming import strip_onnx

SAFE_PUNCTUATION = frozenset("._+,@/- ")
STITCHED_DIR = "stitched"  # the default stitch output, inside the parts directory: this model's, no one else's


def fragment_name(stem: str) -> str:
    return f"{stem}.parts.mk"


def make_word(text: str, what: str) -> str:
    """`text` as one word both Make (in a target or prerequisite) and the shell (in a recipe) read as `text`."""
    bad = next((c for c in text if not (c.isalnum() or c in SAFE_PUNCTUATION)), None)
    if bad is not None:
        raise UsageError(f"{what} {text!r}: the Make fragment cannot name it safely ({_shown(bad)} is syntax to Make or the shell); "
                         "use a name of letters, digits, spaces and ._+,@/-")
    word = text.replace(" ", "\\ ")
    return f"./{word}" if word.startswith("-") else word  # never read as an option


def make_value(args: list[str]) -> str:
    """Arguments as the value of a Make variable whose expansion the shell splits back into exactly `args`."""
    for arg in args:
        bad = next((c for c in arg if c in "\n\r\0"), None)
        if bad is not None:
            raise UsageError(f"{arg!r}: the Make fragment cannot pass an argument holding {_shown(bad)}")
    quoted = " ".join(shlex.quote(a) for a in args)
    # Make reads `\#` as `#` (and 2n+1 backslashes before `#` as n and a `#`), and `$$` as `$`
    return re.sub(r"(\\*)#", lambda m: "\\" * (2 * len(m.group(1)) + 1) + "#", quoted).replace("$", "$$")


def make_fragment(directory: Path, stem: str, count: int, compile_args: list[str], stitch_output: str | None) -> str:
    """One rule for each of the `count` parts (`make -j`, or a build farm), then the stitch. Paths are as split was
    given them (relative ones from the directory split ran in); the variables can be overridden.

    The stitch writes into `<parts>/stitched/` unless told otherwise, and replaces only an earlier stitch of this
    model there (`--replace-stitched`), never another command's output."""
    var = re.sub(r"[^A-Za-z0-9]", "_", stem).upper()
    word = make_word(stem, "model name")
    parts_dir = make_word(str(directory), "-o")
    output = f"$({var}_PARTS)/{STITCHED_DIR}" if stitch_output is None else make_word(str(Path(stitch_output)), "--stitch-output")
    plan = f"$({var}_PARTS)/{plan_file_name(word)}"
    sources = [f"$({var}_PARTS)/{part_name(word, i)}" for i in range(count)]
    compiled = [f"$({var}_COMPILED)/{strip_onnx(part_name(word, i))}_ctx.onnx" for i in range(count)]
    fragment = shlex.quote(str(directory / fragment_name(stem)))
    lines = [f"# Written by ortcompile split: {count} part{'' if count == 1 else 's'} of {stem}.",
             f"# make -f {fragment} -j N  compiles the parts N at a time, then stitches them into $({var}_OUTPUT).",
             "# The variables can be overridden (make VAR=VALUE); paths are Make words: write a space in them as '\\ '.",
             "ORTCOMPILE ?= ortcompile", f"{var}_PARTS ?= {parts_dir}", f"{var}_COMPILED ?= $({var}_PARTS)/compiled", f"{var}_OUTPUT ?= {output}",
             f"{var}_COMPILE_ARGS ?= {make_value(compile_args)}", "",
             f"$({var}_OUTPUT)/{word}_ctx.onnx: {plan} {' '.join(compiled)}",
             f"\t$(ORTCOMPILE) stitch {plan} --parts $({var}_COMPILED) -o $({var}_OUTPUT) --replace-stitched -q", ""]
    for source, target in zip(sources, compiled):
        lines += [f"{target}: {source}", f"\t$(ORTCOMPILE) compile {source} -o $({var}_COMPILED) --force -q $({var}_COMPILE_ARGS)", ""]
    return "\n".join(lines)


def _shown(char: str) -> str:
    names = {" ": "a space", "\t": "a tab", "\n": "a newline", "\r": "a carriage return", "\0": "a NUL byte"}
    return names.get(char, f"{char!r}" if char.isprintable() else f"U+{ord(char):04X}")
