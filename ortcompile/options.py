"""What a compile is asked to do (CompileOptions) and what it produced (CompileResult)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ortcompile.eps.catalog import CPU_EP, KNOWN_EPS
from ortcompile.errors import UsageError
from ortcompile.jsonedge import JsonObject
from ortcompile.layout import LayoutPolicy
from ortcompile.optiontable import TABLE, CriterionSettings, Option

EmbedPolicy = Literal["auto", "always", "never"]
CheckMode = Literal["none", "load", "run", "auto"]
# The two untyped shapes that cross the passes, named once with the reason they stay untyped:
ALL_PLACEMENT_OPTIONS = ("cpu_nodes", "fallback")  # the options that keep nodes off the EP (compile/cpunodes.py, fallback.py)
# Every option a refusal may suggest (readback/nextsteps.py): the placement options, --inputs, --check load.
ALL_REFUSAL_OFFERS = (*ALL_PLACEMENT_OPTIONS, "inputs", "check")


def refusal_offers_for(partitioned: bool, shared: bool) -> tuple[str, ...]:
    """What a refusal may suggest to a compile: --inputs, --check and the placement options such a compile accepts
    (--share-weights takes neither, --partition no --fallback auto)."""
    if shared:
        return ("inputs", "check")
    return ("cpu_nodes", "inputs", "check") if partitioned else ALL_REFUSAL_OFFERS
GivenInputs = dict[str, Any]  # input name -> readback.given.Given (--input/--inputs): a floor above, so named here, not imported
CHECK_MODES: tuple[CheckMode, ...] = ("none", "load", "run")  # weakest first; "auto" is one of load and run
AUTO_RUN_LIMIT = 1 << 30  # --check auto runs the output when its weights are at most this, else loads it


def effective_check(mode: str, weight_bytes: int) -> str:
    """--check auto: run (and compare with the source) up to AUTO_RUN_LIMIT of weights; above, load only: running
    holds the source and the output at once, and the data of a big model is what the check would cost."""
    if mode != "auto":
        return mode
    return "run" if weight_bytes <= AUTO_RUN_LIMIT else "load"


@dataclass(frozen=True)
class PartitionOptions:
    """`--partition`: compile the model as parts, each in its own worker child, and stitch them (compile/parts.py)."""

    budget: int | None = None  # bytes of weights per part; None: auto (--max-context-size, else the EP's graph size limit)
    jobs: int | None = None  # parts compiled at once; None: the CPUs this process may use
    memory_budget: int | None = None  # bytes of RSS the running parts may use together; None: what is available now

    def __post_init__(self) -> None:
        for name in ("budget", "jobs", "memory_budget"):  # 0 would silently mean the default: None says that
            _require_positive(getattr(self, name), f"partition {name}")


@dataclass(frozen=True)
class CompileOptions:
    ep: str = "auto"
    ep_options: dict[str, str] = field(default_factory=dict)
    layout: LayoutPolicy = field(default_factory=LayoutPolicy)
    embed: EmbedPolicy = "auto"
    fix_dims: dict[str, int] = field(default_factory=dict)
    fix_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    require_compiled: bool | None = None  # None: required for EPs that compile, not for pass-through
    force: bool = False
    verify: bool = False  # compare against the source before publishing; a mismatch publishes nothing
    verify_criterion: CriterionSettings = field(default_factory=dict)  # --verify: criterion settings over the EP's default (rtol, min_snr_db, ...)
    if_changed: bool = False  # skip when the published output is current; replace it (no --force) when not
    share_weights: bool = False  # a batch stores identical weights once and shares the EP context (sharing.py)
    prepare: bool = True  # compiling EPs: pin the dims in the graph and fold constants first (compile/prepare.py)
    check: CheckMode = "auto"  # before publishing: load (and run, and compare) the output on its EP in a child
    inputs: GivenInputs = field(default_factory=dict)  # for the check and --verify
    freeze: dict[str, int | float] = field(default_factory=dict)  # --freeze: inputs the compiled model is specialized on
    partition: PartitionOptions | None = None  # --partition: compile as parts (None: the whole model at once)
    max_context_size: int | None = None  # --max-context-size: largest EP graph (with --partition auto: the part budget)
    target: str | None = None  # --target: device generation to compile for (None: the EP's default, see eps/targets.py)
    ep_library: str | None = None  # --ep-library: register this plugin library under the name given by `ep`
    output_name: str | None = None  # -o DIR/FILE.onnx: the compiled model's file name (None: `<stem>_ctx.onnx`)
    require_full: bool = False  # a fragmented EP graph (CPU nodes between EPContext nodes) is an error, not a warning
    compatibility: bool = False  # ask ONNX Runtime whether the output fits the devices here (a child process, ~0.3 s; --json)
    cpu_nodes: tuple[str, ...] = ()  # --cpu-nodes: node names, op:TYPE or globs kept off the EP, on the CPU EP (compile/cpunodes.py)
    lint: bool = True  # fp16 lint before an fp16 EP's compile (off for the parts of --partition: the whole model was linted)
    fallback: str = "off"  # --fallback auto: move the nodes the check finds diverging to the CPU EP and retry (compile/fallback.py)
    # The options a refusal may suggest (ALL_REFUSAL_OFFERS) when the command the user ran is not this compile (a
    # part of --partition, a graph of `ortcompile llm`); None: the ones these options take (refusal_offers).
    offers: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.check not in (*CHECK_MODES, "auto"):
            raise UsageError(f"check mode {self.check!r}: expected one of {', '.join(CHECK_MODES)}, auto")
        # --max-context-size 0 was the default (1 GiB) in disguise, while --partition 0 was refused: both are refused
        _require_positive(self.max_context_size, "max_context_size (--max-context-size)")
        if self.fallback not in ("off", "auto"):
            raise UsageError(f"fallback {self.fallback!r}: expected off or auto")
        if (self.cpu_nodes or self.fallback == "auto") and self.share_weights:
            raise UsageError(_PINS_WITH_SHARED.format(flag="--fallback auto" if self.fallback == "auto" else "--cpu-nodes"))
        if self.fallback == "auto" and self.partition is not None:
            raise UsageError(_FALLBACK_WITH_PARTITION)
        if self.ep_library and _names_cpu_ep(self.ep):
            raise UsageError(f"--ep-library {self.ep_library}: the CPU EP is built into ONNX Runtime, so no library is loaded for "
                             f"--ep {self.ep}; give --ep the EP name the library registers, or drop --ep-library")

    def refusal_offers(self) -> tuple[str, ...]:
        """The options a refusal may suggest: --inputs, --check and the placement options __post_init__ accepts
        beside these."""
        return self.offers if self.offers is not None else refusal_offers_for(self.partition is not None, self.share_weights)

    def recorded(self, ep_name: str, require_compiled: bool, compiles: bool = True, table: Sequence[Option] = TABLE) -> JsonObject:
        """The options that shape the output, as the manifest records them (optiontable.py says which and how; no
        paths, no --force; verify and check settings are left out: they do not change a byte of the output)."""
        resolved = {"ep": ep_name, "require_compiled": require_compiled, "prepare": self.prepare and compiles}  # only a compiling EP's input is prepared
        record: JsonObject = {}
        for entry in table:
            if entry.recorded is None or entry.field is None:
                continue
            value = resolved[entry.field] if entry.field in resolved else self.value_at(entry.field)
            if not self._records(entry, value):
                continue
            group, _, key = entry.recorded.key.rpartition(".")
            (record.setdefault(group, {}) if group else record)[key] = _plain(value)
        return record

    @classmethod
    def from_record(cls, record: JsonObject, table: Sequence[Option] = TABLE, **overrides: Any) -> CompileOptions:
        """The options an output's record says it was made with (`recorded`'s inverse, by the same table), plus the
        caller's `overrides`. How a model was cut (recorded when partitioned) is not read back: give it as an override."""
        values: dict[str, Any] = {}  # CompileOptions' keyword arguments, each of its field's type
        for entry in table:
            if entry.recorded is None or entry.field is None or entry.recorded.when == "partitioned":
                continue
            found, value = _recorded_at(record, entry.recorded.key)
            if found:
                values[entry.field] = _unplain(value)
        layout = {path.split(".", 1)[1]: values.pop(path) for path in [k for k in values if k.startswith("layout.")]}
        return cls(**{**values, **({"layout": LayoutPolicy(**layout)} if layout else {}), **overrides})

    def value_at(self, path: str) -> Any:
        """The value of a field by the option table's path ("layout.align"; None under an unset record)."""
        value: Any = self
        for name in path.split("."):
            value = getattr(value, name) if value is not None else None
        return value

    def _records(self, entry: Option, value: Any) -> bool:
        when = entry.recorded.when if entry.recorded else "always"
        if when == "set":
            return bool(value)
        if when == "not_default":
            return bool(value != entry.default)
        if when == "partitioned":
            return self.partition is not None
        return True


def _plain(value: Any) -> Any:
    """A recorded value as JSON holds it: tables sorted by key, sequences as lists."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in sorted(value.items())}
    return list(value) if isinstance(value, tuple) else value


def _recorded_at(record: JsonObject, key: str) -> tuple[bool, Any]:
    """The value a record holds under a table key ("layout.align" nests); (False, None) when it holds none."""
    value: Any = record
    for name in key.split("."):
        if not isinstance(value, dict) or name not in value:
            return False, None
        value = value[name]
    return True, value


def _unplain(value: Any) -> Any:
    """A recorded value as CompileOptions holds it (`_plain`'s inverse): sequences as tuples, also inside tables."""
    if isinstance(value, dict):
        return {k: tuple(v) if isinstance(v, list) else v for k, v in value.items()}
    return tuple(value) if isinstance(value, list) else value


def _require_positive(value: int | None, what: str) -> None:
    """None means "the default"; a number must mean itself."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise UsageError(f"{what} must be a positive whole number (None for the default), not {value!r}")


def _names_cpu_ep(ep: str) -> bool:
    return ep.strip().lower() in KNOWN_EPS["cpu"].names()


# --cpu-nodes/--fallback auto place nodes themselves (compile/fallback.py, compile/nodecut.py): op_affinity, or a cut
# of the graph when only some nodes of an op type leave the EP; --fallback auto localizes on the whole graph.
_FALLBACK_WITH_PARTITION = (
    "--fallback auto does not work with --partition yet: it finds the nodes to move by compiling the whole graph as a "
    "diagnostic copy, which --partition exists to avoid; compile without --partition, or keep it and name the nodes with "
    "--cpu-nodes NODE ('ortcompile inspect MODEL --lint' lists the fp16-fragile ones; 'ortcompile verify' of an output "
    "published with --check load names the first diverging node)")
_PINS_WITH_SHARED = ("{flag} does not work with --share-weights yet: the models' EP context is compiled in one pass, which the "
                     "placement does not drive; compile the model on its own")


@dataclass
class CompileResult:
    source: Path
    output_dir: Path
    model: str
    ep: str
    ep_version: str
    files: list[JsonObject]
    epcontext_nodes: int
    remaining_ops: dict[str, int]
    graph_bytes: int
    external_initializers: int
    inline_initializers: int
    timings: dict[str, float]
    peak_rss_bytes: int
    inputs: list[Path]  # the source model and its external data files, as paths from the caller's cwd
    up_to_date: bool = False
    peak_rss_by_stage: dict[str, int] = field(default_factory=dict)  # compile (this process or the worker), check
    prepare: JsonObject | None = None  # what the prepare step did (PrepareSummary), None when it did not run
    check: JsonObject | None = None  # the pre-publish check's report (CheckReport.to_json)
    parts: JsonObject | None = None  # --partition: the budget and each part's outcome
    compiled_ops: dict[str, int] = field(default_factory=dict)  # op type -> source nodes now inside EPContext nodes (the manifest's)
    target: JsonObject | None = None  # what the EP compiled for (the manifest's target record)
    compatibility: JsonObject | None = None  # ONNX Runtime's verdict on the output here (eps.CompatibilityReport.to_json)
    fallback: JsonObject | None = None  # --cpu-nodes / --fallback auto: what runs on the CPU EP, why, check before/after

    @property
    def model_path(self) -> Path:
        return self.output_dir / self.model

    @property
    def cpu_nodes(self) -> int | None:
        """Nodes that run on the CPU EP: as the pre-publish check's session placed them; without a check, the nodes
        a compiling EP (or the CPU EP) left in the graph; None when that cannot say (a pass-through GPU EP)."""
        placement = (self.check or {}).get("placement")
        if placement:
            return sum(placement.get(CPU_EP, {}).values())
        if self.epcontext_nodes or self.ep == CPU_EP:
            return sum(self.remaining_ops.values())
        return None

    def to_json(self) -> JsonObject:
        return {
            "source": str(self.source),
            "output_dir": str(self.output_dir),
            "model": str(self.model_path),
            "ep": self.ep,
            "ep_version": self.ep_version,
            "files": self.files,
            "total_bytes": sum(f["size"] for f in self.files),
            "epcontext_nodes": self.epcontext_nodes,
            "compiled_ops": self.compiled_ops,
            "remaining_ops": self.remaining_ops,
            "cpu_nodes": self.cpu_nodes,
            "graph_bytes": self.graph_bytes,
            "initializers": {"external": self.external_initializers, "inline": self.inline_initializers},
            "timings": {k: round(v, 3) for k, v in self.timings.items()},
            "peak_rss_bytes": self.peak_rss_bytes,
            "peak_rss_by_stage": self.peak_rss_by_stage,
            "prepare": self.prepare,
            "check": self.check,
            "target": self.target,
            "compatibility": self.compatibility,
            "parts": self.parts,
            "fallback": self.fallback,
            "up_to_date": self.up_to_date,
        }
