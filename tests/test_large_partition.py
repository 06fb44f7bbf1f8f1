"""Partition-wise compilation of multi-gigabyte models with the QNN EP (issue 13). Marked `large`: run with
`pytest -m large`, one large test at a time (a QNN compile peaks at ~3.9x what it compiles).

- a 4.8 GB model in 6 QNN partitions compiled with `--partition auto --jobs 1`: the whole process tree (parent,
  part workers, check child) stays under 4 x the largest part + 1 GiB, from the OS's accounting; the stitched
  output loads in one QNN session and agrees with the CPU EP;

The first compiles for the default target (HTP v73, fp16 weights: 2.4 GB of contexts, which the simulator loads in
one session; 4.8 GB of fp32 contexts fail there with QNN_COMMON_ERROR_MEM_ALLOC, measured). The second needs fp32
weights (`--ep-option soc_model=0`, QNN's generic SoC) for its one graph to be over what HTP can hold.
- a 2.4 GB model that is one QNN graph: unpartitioned it fails to finalize (QNN_COMMON_ERROR_MEM_ALLOC) and
  publishes nothing; with `--max-context-size 1GiB` it compiles, loads and agrees with the CPU EP.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

try:
    from bigmodel import BigModel, write_qnn_model
    from helpers import cpu_session, qnn_session, without_progress
    from treerss import TreePeak, tree_rss
except ImportError:  # pragma: no cover
    from tests.bigmodel import BigModel, write_qnn_model
    from tests.helpers import cpu_session, qnn_session, without_progress
    from tests.treerss import TreePeak, tree_rss

pytestmark = pytest.mark.large
GiB = 1 << 30
FP32 = ("--ep-option", "soc_model=0")  # QNN's generic SoC: fp32 weights in the HTP graphs
# verify's fp16 criterion: the HTP's fp32 graphs pass it with a wide margin, a wrongly stitched model does not.
MIN_SNR_DB, MIN_COSINE = 20.0, 0.995


def _compile(*args: Any, timeout: float = 1800) -> tuple[subprocess.CompletedProcess[str], int]:
    """`ortcompile ARGS` as a process, with the peak summed RSS of its whole tree."""
    proc = subprocess.Popen([sys.executable, "-m", "ortcompile", *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with TreePeak(proc.pid) as peak:
        stdout, stderr = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), peak.peak


def _agrees_with_cpu(compiled: Path, model: BigModel) -> dict[str, float]:
    """The compiled model in one QNN session against the source on the CPU EP, one seeded input; the sessions are
    opened one after the other so that the test itself peaks at one model, not two."""
    rng = np.random.default_rng(0)
    feed = {model.input_name: rng.standard_normal(model.input_shape).astype(np.float32)}
    before = tree_rss(os.getpid())
    session = qnn_session(compiled)
    load_rss = tree_rss(os.getpid()) - before
    got = session.run(None, feed)[0].astype(np.float64).ravel()
    del session
    expected = cpu_session(model.path).run(None, feed)[0].astype(np.float64).ravel()
    snr_db = float(10 * np.log10(np.sum(expected**2) / np.sum((got - expected) ** 2)))
    cosine = float(got @ expected / (np.linalg.norm(got) * np.linalg.norm(expected)))
    print(f"{compiled.name}: QNN session load +{load_rss / GiB:.2f} GiB RSS; vs CPU: SNR {snr_db:.1f} dB, cosine {cosine:.6f}")
    assert snr_db >= MIN_SNR_DB and cosine >= MIN_COSINE
    return {"snr_db": snr_db, "cosine": cosine, "load_rss": load_rss}


@pytest.fixture(scope="module")
def six_partitions(tmp_path_factory: pytest.TempPathFactory) -> BigModel:
    pytest.importorskip("onnxruntime_qnn")
    return write_qnn_model(tmp_path_factory.mktemp("six"), "six", partitions=6, layers_per_partition=3, damping=0.25)


def test_partitioned_compile_of_4_8_gb_stays_under_4x_its_largest_part(six_partitions: BigModel, tmp_path: Path) -> None:
    model = six_partitions
    assert model.total_bytes >= 4.5e9
    largest_part = 1 * GiB  # --partition auto: at most 1 GiB of weights per part
    bound = 4 * largest_part + GiB
    out = tmp_path / "out"
    proc, peak = _compile("compile", model.path, "-o", out, "--ep", "qnn", "--partition", "auto", "--jobs", "1",
                          "--memory-budget", bound, "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)["outputs"][0]
    parts = result["parts"]["parts"]
    weights = [p["weight_bytes"] for p in parts]
    print(f"{len(parts)} parts of {[round(w / GiB, 2) for w in weights]} GiB; tree peak {peak / GiB:.2f} GiB "
          f"(bound {bound / GiB:.2f}); parts' peaks {[round(p['peak_rss_bytes'] / GiB, 2) for p in parts]} GiB; "
          f"{sum(result['timings'].values()):.0f}s: {result['timings']}")
    assert len(parts) >= 5 and max(weights) <= largest_part
    assert all(p["check"] is True for p in parts), "every part loaded, ran and agreed with its source when it compiled"
    assert peak <= 4 * max(weights) + GiB, f"process tree peaked at {peak / GiB:.2f} GiB"
    assert result["epcontext_nodes"] >= len(parts)
    assert result["remaining_ops"] == {"Sinh": 5}
    manifest = json.loads((out / "six_ctx.manifest.json").read_text())
    assert len(manifest["parts"]) == len(parts)
    blobs = sorted(p.name for p in out.glob("six_ctx_part*_qnn.*.bin"))  # six_ctx_partNN_qnn.<digest>.bin
    # fp16 weights: half their fp32 bytes
    assert len(blobs) == len(parts) and sum((out / b).stat().st_size for b in blobs) >= 0.45 * model.total_bytes
    assert result["check"]["mode"] == "load" and result["check"]["ok"], "the stitched output was loaded before it was published"
    _agrees_with_cpu(out / "six_ctx.onnx", model)


@pytest.fixture(scope="module")
def one_graph(tmp_path_factory: pytest.TempPathFactory) -> BigModel:
    pytest.importorskip("onnxruntime_qnn")
    return write_qnn_model(tmp_path_factory.mktemp("one"), "onegraph", partitions=1, layers_per_partition=9)


def test_one_qnn_graph_over_2_gb_compiles_with_max_context_size(one_graph: BigModel, tmp_path: Path) -> None:
    model = one_graph
    assert model.total_bytes >= 2.2e9
    whole, _ = _compile("compile", model.path, "-o", tmp_path / "whole", "--ep", "qnn", *FP32)  # one 2.4 GB HTP graph
    assert whole.returncode == 1, whole.stderr
    assert "QNN_COMMON_ERROR_MEM_ALLOC" in whole.stderr and len(without_progress(whole.stderr)) == 1
    assert not (tmp_path / "whole").exists(), "a failed compile leaves nothing behind"
    out = tmp_path / "parts"
    proc, peak = _compile("compile", model.path, "-o", out, "--ep", "qnn", *FP32, "--max-context-size", "1GiB", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)["outputs"][0]
    print(f"--max-context-size 1GiB: {len(result['parts']['parts'])} parts, tree peak {peak / GiB:.2f} GiB, {result['timings']}")
    assert len(result["parts"]["parts"]) >= 3 and result["remaining_ops"] == {}
    _agrees_with_cpu(out / "onegraph_ctx.onnx", model)
