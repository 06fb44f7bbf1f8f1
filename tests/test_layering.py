"""The layering docs/design.md states, checked on every module's imports (read with ast, nothing imported).

Each room (a folder of ortcompile/, or a top-level module) stands on a floor; a module may import its own floor and
the floors below, never one above, and no files import each other in a loop (function-level and TYPE_CHECKING
imports count: they are arrows too). Imports of ortcompile's own modules sit at the top of a module, except the few
in LAZY_IMPORTS, each with the start-up path it keeps light.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "ortcompile"

# Floors, lowest first: docs/design.md "Rooms and what each may import".
FLOORS: list[set[str]] = [  # floor 0 first
    {"errors", "naming", "paths", "trust", "sizes", "version", "progress", "native", "onnxfacts", "layout", "worker", "zygote", "child", "ortmarkers",
     "durable", "jsonedge"},
    {"eps"},
    {"options", "configkeys", "optiontable"},
    {"output"},
    {"plan"},
    {"run"},
    {"readback"},
    {"compile", "bench"},
    {"config", "llm"},
    {"cli", "__init__", "__main__"},
]

HELP = "--help: a command's module loads click and the cli only; what the command runs loads when it runs"
IF_CHANGED = "--if-changed: the import pulls in numpy or onnx, which the up-to-date path never needs and a compile's parent needs only here"
LAZY_IMPORTS: dict[tuple[str, str], str] = {
    ("ortcompile.cli", "ortcompile.cli.bench"): "the commands register on the group once it exists (each imports cli.output)",
    ("ortcompile.cli", "ortcompile.cli.check"): "the commands register on the group once it exists (each imports cli.output)",
    ("ortcompile.cli", "ortcompile.cli.compile"): "the commands register on the group once it exists (each imports cli.output)",
    ("ortcompile.cli", "ortcompile.cli.eps"): "the commands register on the group once it exists (each imports cli.output)",
    ("ortcompile.cli", "ortcompile.cli.llm"): "the commands register on the group once it exists (each imports cli.output)",
    ("ortcompile.cli", "ortcompile.cli.inspect"): "the commands register on the group once it exists (each imports cli.output)",
    ("ortcompile.cli", "ortcompile.cli.split"): "the commands register on the group once it exists (each imports cli.output)",
    ("ortcompile.cli", "ortcompile.cli.stitch"): "the commands register on the group once it exists (each imports cli.output)",
    ("ortcompile.cli", "ortcompile.cli.verify"): "the commands register on the group once it exists (each imports cli.output)",
    ("ortcompile.cli.bench", "ortcompile.bench.pipeline"): HELP,
    ("ortcompile.cli.bench", "ortcompile.cli.render"): HELP,
    ("ortcompile.cli.bench", "ortcompile.plan.shapes"): HELP,
    ("ortcompile.cli.check", "ortcompile.eps"): HELP + " (eps.check_compatibility loads the registry)",
    ("ortcompile.cli.compile", "ortcompile.cli.render"): HELP,
    ("ortcompile.cli.compile", "ortcompile.compile.job"): HELP,
    ("ortcompile.cli.compile", "ortcompile.config"): HELP,
    ("ortcompile.cli.compile", "ortcompile.output.incremental"): HELP,
    ("ortcompile.cli.inspect", "ortcompile.cli.render"): HELP,
    ("ortcompile.cli.inspect", "ortcompile.readback.inspect"): HELP,
    ("ortcompile.cli.inspect", "ortcompile.readback.placement"): HELP,
    ("ortcompile.cli.inspect", "ortcompile.readback.lint"): HELP,
    ("ortcompile.cli.llm", "ortcompile.llm"): HELP,
    ("ortcompile.cli.llm", "ortcompile.native"): HELP,
    ("ortcompile.cli.output", "ortcompile.progress"): HELP,
    ("ortcompile.cli.params", "ortcompile.readback.given"): HELP + " (given imports numpy)",
    ("ortcompile.cli.shaping", "ortcompile.compile.freeze"): HELP,
    ("ortcompile.cli.tableopts", "ortcompile.eps"): HELP + " (shell completion asks for EP names only when the shell does)",
    ("ortcompile.cli.tableopts", "ortcompile.eps.targets"): HELP + " (shell completion asks for targets only when the shell does)",
    ("ortcompile.cli.shaping", "ortcompile.config"): HELP,
    ("ortcompile.cli.shaping", "ortcompile.plan.shapes"): HELP,
    ("ortcompile.cli.split", "ortcompile.cli.render"): HELP,
    ("ortcompile.cli.split", "ortcompile.compile.split"): HELP,
    ("ortcompile.cli.split", "ortcompile.config"): HELP,
    ("ortcompile.cli.stitch", "ortcompile.compile.stitch"): HELP,
    ("ortcompile.cli.verify", "ortcompile.cli.render"): HELP,
    ("ortcompile.cli.verify", "ortcompile.plan.shapes"): HELP,
    ("ortcompile.cli.verify", "ortcompile.readback.verify"): HELP,
    ("ortcompile.compile.finish", "ortcompile.readback.check"): IF_CHANGED,
    ("ortcompile.compile.finish", "ortcompile.readback.given"): IF_CHANGED,
    ("ortcompile.compile.finish", "ortcompile.readback.parity"): IF_CHANGED,
    ("ortcompile.compile.finish", "ortcompile.readback.verify"): IF_CHANGED,
    ("ortcompile.compile.fallback", "ortcompile.readback.localize"): IF_CHANGED + " (only a check that failed is localized)",
    ("ortcompile.config", "ortcompile.readback.given"): "--if-changed: numpy loads only when a config names the check's inputs",
    ("ortcompile.compile.job", "ortcompile.compile.driver"): "--if-changed: the compile pipeline loads only for an output that is not up to date",
    ("ortcompile.compile.ortstep", "ortcompile.readback.hints"): IF_CHANGED + " (only a compile that fails asks for the hint)",
    ("ortcompile.compile.prepare", "ortcompile.readback.hints"): IF_CHANGED + " (only a compile that fails asks for the hint)",
    ("ortcompile.compile.partsource", "ortcompile.readback.feeds"): "--if-changed: only the --input check of a --partition split needs numpy and onnx",
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> set[str]:
    """The own modules an import statement loads (a name imported from a package counts as its submodule when it is one)."""
    if isinstance(node, ast.Import):
        names = {alias.name for alias in node.names}
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
            base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
        names = {f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names}
    found = set()
    for name in names:
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name.startswith("ortcompile") and name != module:
            found.add(name)
    return found


def _imports() -> list[tuple[str, str, bool, int]]:
    """(importer, imported, inside a function, line) for every import of an own module."""
    rows = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        in_function = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(f)}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                rows += [(module, target, id(node) in in_function, node.lineno) for target in _targets(module, node)]
    return rows


IMPORTS = _imports()


def _floor(module: str) -> int:
    parts = module.split(".")
    room = parts[1] if len(parts) > 1 else "__init__"
    for index, rooms in enumerate(FLOORS):
        if room in rooms:
            return index
    raise AssertionError(f"{module}: its room {room!r} stands on no floor: add it to FLOORS and to docs/design.md")


def test_every_room_stands_on_a_floor() -> None:
    for module in MODULES:
        _floor(module)


def test_no_import_runs_back_up() -> None:
    upward = [f"{a} (line {line}) imports {b}: floor {_floor(a)} < {_floor(b)}" for a, b, _, line in IMPORTS if _floor(a) < _floor(b)]
    assert not upward, "\n".join(upward)


def test_no_files_import_each_other_in_a_loop() -> None:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for a, b, _, _ in IMPORTS:
        graph[a].add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    assert not circles, "files that import each other in a loop: " + "; ".join(" <-> ".join(c) for c in circles)


def test_own_imports_are_at_module_top_unless_listed() -> None:
    inside = {(a, b) for a, b, in_function, _ in IMPORTS if in_function}
    unlisted = sorted(f"{a} imports {b} inside a function (line {line})" for a, b, in_function, line in IMPORTS
                      if in_function and (a, b) not in LAZY_IMPORTS)
    assert not unlisted, "move these to the module's top, or add them to LAZY_IMPORTS with the start-up path they keep light:\n" + "\n".join(unlisted)
    stale = sorted(f"{a} -> {b}" for a, b in LAZY_IMPORTS if (a, b) not in inside)
    assert not stale, "LAZY_IMPORTS names imports that are not function-level any more: " + ", ".join(stale)


@pytest.mark.parametrize("reason", sorted(set(LAZY_IMPORTS.values())))
def test_every_lazy_import_says_why(reason: str) -> None:
    assert reason.startswith(("--help", "--if-changed", "the commands register")), reason
