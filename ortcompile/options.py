"""What a compile is asked to do (CompileOptions) and what it produced (CompileResult)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ortcompile.graphpass import EmbedPolicy
from ortcompile.plan import LayoutPolicy


@dataclass(frozen=True)
class Tolerance:
    # QNN's HTP simulator matched the CPU EP to ~1e-6 on fp32 fixtures; these bounds leave room for
    # EPs that compute in fp16 internally while still catching a wrong weight or a wrong graph.
    rtol: float = 1e-3
    atol: float = 1e-4


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
    verify_tolerance: Tolerance = field(default_factory=Tolerance)
    if_changed: bool = False  # skip when the published output is current; replace it (no --force) when not
    share_weights: bool = False  # a batch stores identical weights once and shares the EP context (sharing.py)
    target: str | None = None  # --target: device generation to compile for (None: the EP's default, see eps/targets.py)
    ep_library: str | None = None  # --ep-library: register this plugin library under the name given by `ep`

    def recorded(self, ep_name: str, require_compiled: bool) -> dict[str, Any]:
        """The options that shape the output, as the manifest records them (no paths, no --force)."""
        return {
            "ep": ep_name,
            "ep_options": dict(sorted(self.ep_options.items())),
            "layout": asdict(self.layout),
            "embed": self.embed,
            "fix_dims": dict(sorted(self.fix_dims.items())),
            "fix_shapes": {k: list(v) for k, v in sorted(self.fix_shapes.items())},
            "require_compiled": require_compiled,
            "share_weights": self.share_weights,
            **({"target": self.target} if self.target else {}),
        }  # verify settings are left out: they do not change a byte of the output


@dataclass
class CompileResult:
    source: Path
    output_dir: Path
    model: str
    ep: str
    ep_version: str
    files: list[dict[str, Any]]
    epcontext_nodes: int
    remaining_ops: dict[str, int]
    graph_bytes: int
    external_initializers: int
    inline_initializers: int
    timings: dict[str, float]
    peak_rss_bytes: int
    inputs: list[Path]  # the source model and its external data files, as paths from the caller's cwd
    up_to_date: bool = False

    @classmethod
    def from_manifest(cls, source: Path, output_dir: Path, manifest: dict[str, Any], seconds: float, peak_rss: int) -> CompileResult:
        """The result of a compile that found its output current and did nothing."""
        nodes, inits = manifest.get("nodes", {}), manifest.get("initializers", {})
        model = manifest["model"]
        return cls(
            source=source, output_dir=output_dir, model=model, ep=manifest["versions"]["ep"]["name"],
            ep_version=manifest["versions"]["ep"]["version"], files=manifest["files"],
            epcontext_nodes=nodes.get("epcontext", 0), remaining_ops=nodes.get("remaining_ops", {}),
            graph_bytes=(output_dir / model).stat().st_size, external_initializers=inits.get("external", 0),
            inline_initializers=inits.get("inline", 0), timings={"check": seconds}, peak_rss_bytes=peak_rss,
            inputs=[source.parent / f["name"] for f in manifest["input"]["files"]], up_to_date=True,
        )

    @property
    def model_path(self) -> Path:
        return self.output_dir / self.model

    def to_json(self) -> dict[str, Any]:
        return {
            "source": str(self.source),
            "output_dir": str(self.output_dir),
            "model": str(self.model_path),
            "ep": self.ep,
            "ep_version": self.ep_version,
            "files": self.files,
            "total_bytes": sum(f["size"] for f in self.files),
            "epcontext_nodes": self.epcontext_nodes,
            "remaining_ops": self.remaining_ops,
            "graph_bytes": self.graph_bytes,
            "initializers": {"external": self.external_initializers, "inline": self.inline_initializers},
            "timings": {k: round(v, 3) for k, v in self.timings.items()},
            "peak_rss_bytes": self.peak_rss_bytes,
            "up_to_date": self.up_to_date,
        }
