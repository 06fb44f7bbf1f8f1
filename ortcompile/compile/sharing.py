"""`--share-weights`: compile several models that share weights (e.g. an LLM's prefill and decode graphs).

Two kinds of sharing, both deterministic:
- CPU-side initializers are deduplicated by content: a tensor whose bytes (sha256) were already written for an
  earlier model in the batch is referenced where it is, so identical weights are stored once, in
  `<first stem>_shared.<digest>.data` (shards `.data.1`, ...; named by content like every referenced file).
- EP contexts are shared through ONNX Runtime's `ep.share_ep_contexts` (the last model also sets
  `ep.stop_share_ep_contexts`): an EP that supports it (QNN does) writes one blob, named after the first
  model (`<first stem>_ctx_qnn.<digest>.bin`), that every model's EPContext nodes reference. Blobs are never
  embedded in this mode.

The batch is one unit: compiled into one staging directory and published together, or not at all.
Each model gets its own manifest listing every file it needs, shared ones marked `"shared": true`.
This is the library's entry point; the batch goes the way every compile goes (job.compile_models_to, one unit),
and is built by sharedbatch.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from ortcompile.compile.job import compile_models_to
from ortcompile.naming import Destination
from ortcompile.options import CompileOptions, CompileResult
from ortcompile.progress import Reporter


def compile_shared(sources: Sequence[str | os.PathLike[str]], output_dir: str | os.PathLike[str],
                   options: CompileOptions | Callable[[Path], CompileOptions], reporter: Reporter | None = None) -> list[CompileResult]:
    """Compile `sources` as one weight-sharing batch into `output_dir`, atomically. `options`: the same for every
    model, or a function from a source to its options, which may differ only in their pins and check inputs
    (sharedbatch.PER_MODEL)."""
    per_model = [options(Path(source)) if callable(options) else options for source in sources]
    named = per_model[0].output_name if per_model else None  # (one set of options: one output name, if any)
    return compile_models_to(sources, Destination.of(output_dir, sources, named), per_model, reporter, share_weights=True)
