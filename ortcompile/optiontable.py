"""The compile options, one record each: everything that makes an option is said here once.

From this table are generated: `compile`'s click options (and `split`'s shared ones; cli/tableopts.py turns the
plain data below into click), their `--help` sections (cli/sections.py), the config file's keys and checks
(configkeys.py), the built-in defaults (config.py), the options a manifest records (`CompileOptions.recorded`)
and the flags `split` passes to each part (compile/split.py `part_cli_args`). A new option is one `Option` here
(and its field in `CompileOptions` when the library acts on it).

No click and no ortcompile module is imported here: the table is data, read from every floor above.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

# How a value is read (cli/tableopts.py maps each to a click type; configkeys.py checks config values by `ConfigKey`).
ValueType = Literal["text", "path", "file", "existing_path", "size", "positive_size", "partition_size", "count", "float",
                    "choice", "pair", "precision"]  # precision: a choice of readback.criteria.PRECISIONS (a floor above)
Kind = Literal["value", "flag", "switch", "repeat"]  # switch: "--on/--off"; repeat: a repeatable option
When = Literal["always", "set", "not_default", "partitioned"]  # when a manifest records an option


@dataclass(frozen=True)
class ConfigKey:
    """The option's key in a config file (docs/config.md) and the check of its value (configkeys.CHECKS)."""

    key: str  # the TOML key: the flag without its dashes
    check: str  # a name in configkeys.CHECKS; "table:NAME" is a table of values each checked by NAME
    name: str | None = None  # the settings' name when it is not the option's (`inputs` is a path there, files here)


@dataclass(frozen=True)
class Recorded:
    """How a manifest (and a parts plan) records the option: under `key` ("layout.align" nests), `when`:
    always, when set (not empty/None), when not the default, or when the model is compiled as parts."""

    key: str
    when: When = "always"


@dataclass(frozen=True)
class Option:
    name: str  # the click parameter's name; the settings' (config.py) unless ConfigKey.name says otherwise
    flags: tuple[str, ...]  # as click declares them: ("-o", "--output"), ("--prepare/--no-prepare",)
    help: str
    section: str  # the --help section (cli/sections.py SECTIONS' titles)
    kind: Kind = "value"
    type: ValueType = "text"
    choices: tuple[str, ...] = ()
    default: Any = None  # the built-in value, as the library takes it (1048576, not "1MiB")
    shown_default: str | None = None  # what click is given and --help shows, when not str(default) ("1MiB")
    show_default: bool = False
    metavar: str | None = None
    example: str | None = None  # type "pair": an example in the error for a malformed value
    required: bool = False
    complete: str | None = None  # shell completion, by name (cli/shaping.py: "ep", "target")
    split: bool = False  # also an option of `split`: it shapes each part as it shapes the whole
    ep_bound: bool = False  # chosen for an EP: a config level naming another EP drops it (config.merge)
    config: ConfigKey | None = None
    field: str | None = None  # where CompileOptions holds it ("layout.align"); None: the command's own wiring
    recorded: Recorded | None = None
    part: bool = False  # passed to each part of a split (its parts plan and Make fragment)
    part_after: str | None = None  # passed after this option's flag (the order split has always written)

    @property
    def long_name(self) -> str:
        """The first long name, as --help and errors show it ("--output" of -o, --output, --output-dir)."""
        return next(f.split("/")[0] for f in self.flags if f.startswith("--"))

    @property
    def setting(self) -> str:
        """The name of its value in merged settings (config.py)."""
        return (self.config.name or self.name) if self.config else self.name


PARTITION_AUTO = 0  # `--partition auto` as settings hold it (a size is positive): the planner decides the budget (plan/planner.py)


def is_auto(value: object) -> bool:
    """`auto` as --partition and the config's `partition` spell it."""
    return str(value).strip().lower() == "auto"


_CRITERION_DEFAULT = " [default: by the EP's precision, see docs/verify.md]"
_CHECKING = "Checking before publishing"

# In compile's --help order within each section (the sections' own order is cli/sections.py's); the config keys
# follow this order in messages.
TABLE: tuple[Option, ...] = (
    Option("output_dir", ("-o", "--output", "--output-dir"), section="Output", type="path", required=True,
           help="Directory for the compiled models and their files (DIR/: named <stem>_ctx.onnx), or the compiled model's path (FILE.onnx)."),
    Option("ep", ("--ep",), section="Execution provider", default="auto", show_default=True, complete="ep", split=True,
           help="Execution provider: qnn, openvino, webgpu, cpu, auto, or a full EP name.",
           config=ConfigKey("ep", "text"), field="ep", recorded=Recorded("ep"), part=True),
    Option("ep_options", ("--ep-option",), section="Execution provider", kind="repeat", type="pair", default={},
           example="htp_graph_finalization_optimization_mode=3", split=True, ep_bound=True, help="Provider option (repeatable).",
           config=ConfigKey("ep-option", "table:option_value"), field="ep_options", recorded=Recorded("ep_options"), part=True),
    Option("target", ("--target",), section="Execution provider", complete="target", split=True, ep_bound=True,
           help="Device generation to compile for, real or virtual (see 'ortcompile eps --targets').",
           config=ConfigKey("target", "text"), field="target", recorded=Recorded("target", "set"), part=True),
    Option("ep_library", ("--ep-library",), section="Execution provider", type="file", split=True, ep_bound=True,
           help="Register this plugin EP library (a shared library) under the EP name given with --ep (not cpu: it is built in).",
           config=ConfigKey("ep-library", "path"), field="ep_library", part=True),
    Option("inline_threshold", ("--inline-threshold",), section="File layout", type="size", default=1024, show_default=True, split=True,
           help="Initializers smaller than this stay in the graph proto.",
           config=ConfigKey("inline-threshold", "size"), field="layout.inline_threshold", recorded=Recorded("layout.inline_threshold"), part=True),
    Option("align", ("--align",), section="File layout", type="size", default=4096, show_default=True, split=True,
           help="Offset alignment of large initializers in the data file.",
           config=ConfigKey("align", "align"), field="layout.align", recorded=Recorded("layout.align"), part=True),
    Option("align_threshold", ("--align-threshold",), section="File layout", type="size", default=1 << 20, shown_default="1MiB",
           show_default=True, split=True, help="Initializers at least this big get --align; smaller ones natural alignment.",
           config=ConfigKey("align-threshold", "size"), field="layout.align_threshold", recorded=Recorded("layout.align_threshold"), part=True),
    Option("shard_size", ("--shard-size",), section="File layout", type="size", split=True,
           help="Split external data into files of at most this size (.data, .data.1, ...).",
           config=ConfigKey("shard-size", "positive_size"), field="layout.shard_size", recorded=Recorded("layout.shard_size"), part=True),
    Option("embed", ("--embed",), section="File layout", type="choice", choices=("auto", "always", "never"), default="auto",
           show_default=True, split=True, help="Embed EP blobs in the model (auto: only small ones).",
           config=ConfigKey("embed", "choice"), field="embed", recorded=Recorded("embed"), part=True),
    Option("fix_dims", ("--fix-dim",), section="Shapes and graph", kind="repeat", type="pair", default={}, metavar="NAME=VALUE",
           example="batch=1", split=True, help="Pin a symbolic dimension (repeatable).",
           config=ConfigKey("fix-dim", "table:dim"), field="fix_dims", recorded=Recorded("fix_dims")),
    Option("fix_shapes", ("--fix-shape",), section="Shapes and graph", kind="repeat", default={}, metavar="INPUT=D0,D1,...", split=True,
           help="Pin an input's shape (repeatable).",
           config=ConfigKey("fix-shape", "table:shape"), field="fix_shapes", recorded=Recorded("fix_shapes")),
    Option("freeze", ("--freeze",), section="Shapes and graph", kind="repeat", type="pair", default={}, metavar="INPUT=VALUE",
           example="sr=16000", split=True,
           help="Specialize the model on an input's value (an If switching on it is decided at compile time; repeatable).",
           config=ConfigKey("freeze", "table:number"), field="freeze", recorded=Recorded("freeze", "set")),
    Option("prepare", ("--prepare/--no-prepare",), section="Shapes and graph", kind="switch", default=True, show_default=True, split=True,
           help="Compiling EPs: pin the dims in the graph and fold constants (ORT basic optimization) before the EP sees it.",
           config=ConfigKey("prepare", "bool"), field="prepare", recorded=Recorded("prepare"), part=True, part_after="check_mode"),
    Option("partition", ("--partition",), section="Large models: parts", type="partition_size", split=True,
           help="Compile as parts of at most SIZE of weights (auto: the EP's graph limit), each in its own child process, then stitch them.",
           config=ConfigKey("partition", "partition"), field="partition.budget", recorded=Recorded("partition.budget", "partitioned")),
    Option("max_context_size", ("--max-context-size",), section="Large models: parts", type="positive_size", split=True,
           help="Largest EP graph to compile at once (implies --partition auto).",
           config=ConfigKey("max-context-size", "positive_size"), field="max_context_size",
           recorded=Recorded("partition.max_context_size", "partitioned")),
    Option("jobs", ("--jobs",), section="Large models: parts", type="count",
           help="With --partition: parts compiled at once [default: the CPUs it may run on, within --memory-budget].", field="partition.jobs"),
    Option("memory_budget", ("--memory-budget",), section="Large models: parts", type="size",
           help="With --partition: RSS the running parts may use together [default: available memory].", field="partition.memory_budget"),
    Option("check_mode", ("--check",), section=_CHECKING, type="choice", choices=("auto", "none", "load", "run"), default="auto",
           show_default=True, split=True,
           help="Before publishing, open the output on its EP in a child process: load it, or load, run and compare with the source "
                "(auto: run up to 1 GiB of weights, else load).",
           config=ConfigKey("check", "choice"), field="check", part=True),
    Option("require_compiled", ("--require-compiled/--allow-partial",), section=_CHECKING, kind="switch", split=True,
           help="Whether 'no node compiled' is an error [default: error for compiling EPs].",
           config=ConfigKey("require-compiled", "bool"), field="require_compiled", recorded=Recorded("require_compiled"), part=True),
    Option("require_full", ("--require-full",), section=_CHECKING, kind="flag", default=False, field="require_full",
           help="A fragmented EP graph (CPU nodes between EPContext nodes) is an error (exit 1), not a warning."),
    Option("verify", ("--verify",), section=_CHECKING, kind="flag", default=False, field="verify",
           help="Compare with the source before publishing; on mismatch publish nothing (exit 5)."),
    Option("input_args", ("--input",), section=_CHECKING, kind="repeat", metavar="NAME=FILE.npy|VALUE",
           help="One input from a .npy file, or a scalar that fills it (repeatable); the rest are generated."),
    Option("inputs_file", ("--inputs",), section=_CHECKING, type="existing_path", help="Inputs from an .npz file or a directory of NAME.npy files.",
           config=ConfigKey("inputs", "path", name="inputs_path")),  # the check's (and --verify's) inputs: an .npz file or a directory
    Option("cpu_nodes", ("--cpu-nodes",), section="When the NPU computes something else", kind="repeat", default=(), metavar="PATTERN",
           split=True, help="Keep these nodes off the EP, on the CPU EP: a node name, op:TYPE or a glob (repeatable; QNN: by op type).",
           config=ConfigKey("cpu-nodes", "patterns"), field="cpu_nodes", recorded=Recorded("cpu_nodes", "set")),
    Option("fallback", ("--fallback",), section="When the NPU computes something else", type="choice", choices=("off", "auto"), default="off",
           show_default=True, split=True,
           help="When the check finds outputs that differ: off refuses, naming the node; auto moves the diverging nodes to the "
                "CPU EP and compiles again (up to 3 rounds).",
           config=ConfigKey("fallback", "choice"), field="fallback", recorded=Recorded("fallback", "not_default")),
    Option("precision", ("--precision",), section=_CHECKING, type="precision",
           help="Judge as an EP of this precision [default: the EP's, quantized for QDQ models]."),
    Option("rtol", ("--rtol",), section=_CHECKING, type="float", help="Relative tolerance, element by element." + _CRITERION_DEFAULT),
    Option("atol", ("--atol",), section=_CHECKING, type="float", help="Absolute tolerance, element by element." + _CRITERION_DEFAULT),
    Option("min_snr_db", ("--min-snr",), section=_CHECKING, type="float", help="Parity: SNR in dB at least this." + _CRITERION_DEFAULT),
    Option("min_cosine", ("--min-cosine",), section=_CHECKING, type="float", help="Parity: cosine similarity at least this." + _CRITERION_DEFAULT),
    Option("min_top1", ("--min-top1",), section=_CHECKING, type="float",
           help="Parity: decisive top-1 agreement at least this (0..1)." + _CRITERION_DEFAULT),
    Option("config_path", ("--config",), section="Settings files", type="file", split=True,
           help="Settings file (ortcompile.toml, or pyproject.toml with [tool.ortcompile]) [default: $ORTCOMPILE_CONFIG, else found upwards]."),
    Option("no_config", ("--no-config",), section="Settings files", kind="flag", default=False, split=True,
           help="Read no settings file: built-in defaults and the command line only."),
    Option("force", ("--force",), section="Output", kind="flag", default=False, field="force", help="Replace earlier outputs of the same model."),
    Option("share_weights", ("--share-weights",), section="Batches", kind="flag", default=False, field="share_weights",
           help="Batch: store identical weights once and share the EP context across the models.", recorded=Recorded("share_weights")),
    Option("if_changed", ("--if-changed",), section="Output", kind="flag", default=False, field="if_changed",
           help="Do nothing if the output is current (same input digest, options, versions); else rebuild it."),
    Option("depfile", ("--depfile",), section="Output", type="file", help="Write a Make dependency file (like gcc -MD)."),
)

INPUT_NAMES = ("input_args", "inputs_file")  # the inputs verify and bench take too (cli/tableopts.py input_options)
CRITERION_NAMES = ("precision", "rtol", "atol", "min_snr_db", "min_cosine", "min_top1")  # how outputs are judged (verify, bench)
CriterionSettings = dict[str, float | str]  # criterion settings by CRITERION_NAMES: thresholds, and the precision's name


def option(name: str) -> Option:
    return next(o for o in TABLE if o.name == name)


# Each view below takes the table as an argument (the whole table by default), so a test can add an entry to a copy.


def configured(table: Sequence[Option] = TABLE) -> tuple[Option, ...]:
    """The options a config file may set, in the table's order."""
    return tuple(o for o in table if o.config is not None)


def shared_settings(table: Sequence[Option] = TABLE) -> tuple[Option, ...]:
    """The options that shape an output, shared by compile and split, as the config file's keys name them."""
    return tuple(o for o in table if o.split and o.config is not None)


def part_flagged(table: Sequence[Option] = TABLE) -> tuple[Option, ...]:
    """The options passed to each part, in the order their flags are written."""
    ordered = [o for o in table if o.part and o.part_after is None]
    for late in (o for o in table if o.part and o.part_after is not None):
        ordered.insert(next(i for i, o in enumerate(ordered) if o.name == late.part_after) + 1, late)
    return tuple(ordered)
