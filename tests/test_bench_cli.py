"""`ortcompile bench` as scripts use it: text and --json reports, references, budgets, exit codes.

Every test runs `python -m ortcompile bench` in a fresh process with the real QNN EP (compiled models) or the
CPU EP. The WebGPU/graph-capture side of bench is in test_webgpu.py; the pool's policy in test_residency.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from helpers import FIXTURES, assert_one_line_error, run_cli
from test_residency import MARGIN, Mlp

MiB = 1 << 20
QNN_MARGIN = MARGIN["qnn"]  # RSS the QNN simulator keeps after its sessions are gone (a plateau): see test_residency
# ru_maxrss (process peak) and /proc/self/statm (pool peak samples) come from different kernel counters; the
# per-thread RSS counters are synced lazily, and the process peak was seen 0.3 MiB *below* the pool peak.
COUNTER_SLACK = 4 * MiB

MODEL_KEYS = {"name", "model", "reference", "loads", "reloads", "hits", "evictions", "captures", "load_seconds", "mean_run_seconds",
              "footprint_bytes", "source_load_seconds", "reload_seconds_saved_vs_source", "mismatches"}
TOP_KEYS = {"format", "ok", "ep", "memory_budget_bytes", "cycles", "graph_capture", "baseline_rss_bytes", "ep_startup_rss_bytes",
            "pool_peak_rss_bytes", "process_peak_rss_bytes", "models", "events"}
MISMATCH_KEYS = {"run", "name", "shape", "dtype", "max_abs", "max_rel", "mismatches", "total", "reason", "ok",  # readback.compare.OutputComparison
                 "criterion", "exact", "snr_db", "psnr_db", "cosine", "top1", "top1_rows", "topk", "nonfinite", "note"}
MISSING_OUTPUT_KEYS = {"run", "name", "ok", "reason"}  # an output the reference has and the model lacks
SIZE = r"\d+(\.\d)? (B|KiB|MiB|GiB)"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """QNN-compiled fixtures (mlp, split) and two larger MLPs (11.9 and 23.6 MiB of weights) with their sources,
    plus `other`: an MLP with mlp.onnx's exact signature (x[1,256] -> y[1,256]) but other weights."""
    root = tmp_path_factory.mktemp("bench")
    paths = {"mlp": FIXTURES / "mlp.onnx", "split": FIXTURES / "split.onnx", "other": root / "other.onnx",
             "big1": root / "big1.onnx", "big2": root / "big2.onnx"}
    Mlp("other", 256, 9).write(paths["other"])
    Mlp("big1", 1248, 2).write(paths["big1"])
    Mlp("big2", 1760, 4).write(paths["big2"])
    out = root / "out"
    proc = run_cli("compile", paths["mlp"], paths["split"], paths["big1"], paths["big2"], "-o", out, "--ep", "qnn", "-q", timeout=300)
    assert proc.returncode == 0, proc.stderr
    for name in ("mlp", "split", "big1", "big2"):
        paths[f"{name}_ctx"] = out / f"{name}_ctx.onnx"
    return paths


def bench(*args: Any) -> Any:
    return run_cli("bench", *args, timeout=300)


def bench_json(*args: Any) -> dict[str, Any]:
    proc = bench(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # fails on any stray line


def check_report(report: dict[str, Any]) -> None:
    """Schema and internal consistency of a --json report."""
    assert set(report) == TOP_KEYS
    assert report["format"] == "ortcompile-bench/1"
    kinds = {"load", "hit", "evict", "reload", "capture"}
    for event in report["events"]:
        assert set(event) == {"kind", "model", "seconds", "bytes"} and event["kind"] in kinds
        assert event["seconds"] >= 0 and event["bytes"] >= 0
    names = [m["name"] for m in report["models"]]
    assert {e["model"] for e in report["events"]} <= set(names)
    for m in report["models"]:
        assert set(m) == MODEL_KEYS
        mine = [e for e in report["events"] if e["model"] == m["name"]]
        loads = [e for e in mine if e["kind"] in ("load", "reload")]
        assert m["loads"] == len(loads) == len(m["load_seconds"]) >= 1
        assert [e["kind"] for e in loads] == ["load"] + ["reload"] * (len(loads) - 1)
        assert m["load_seconds"] == [e["seconds"] for e in loads] and all(s > 0 for s in m["load_seconds"])
        assert m["reloads"] == m["loads"] - 1
        assert m["hits"] == sum(e["kind"] == "hit" for e in mine)
        assert m["evictions"] == sum(e["kind"] == "evict" for e in mine)
        assert m["captures"] == sum(e["kind"] == "capture" for e in mine)
        assert m["loads"] + m["hits"] == report["cycles"]  # one step per model per cycle
        assert m["mean_run_seconds"] > 0 and m["footprint_bytes"] > 0
        for mismatch in m["mismatches"]:
            assert set(mismatch) in (MISMATCH_KEYS, MISSING_OUTPUT_KEYS) and 1 <= mismatch["run"] <= report["cycles"]
            assert mismatch["ok"] is False
        if m["source_load_seconds"] is None:
            assert m["reload_seconds_saved_vs_source"] is None
        elif m["reloads"]:
            # sum over reloads of (source load - compiled reload); recomputed from the rounded seconds
            recomputed = sum(m["source_load_seconds"] - s for s in m["load_seconds"][1:])
            assert abs(m["reload_seconds_saved_vs_source"] - recomputed) <= 1e-3 * (1 + m["reloads"])
        else:
            assert m["reload_seconds_saved_vs_source"] is None
    assert report["ok"] == all(not m["mismatches"] for m in report["models"])
    # Memory: baseline is this process before the pool's first load: python + numpy + onnxruntime (+ EP).
    baseline, pool_peak, process_peak = report["baseline_rss_bytes"], report["pool_peak_rss_bytes"], report["process_peak_rss_bytes"]
    assert 30 * MiB < baseline <= pool_peak < 4096 * MiB
    assert 0 <= report["ep_startup_rss_bytes"] < baseline  # part of the baseline: the EP was started before it was taken
    assert process_peak >= pool_peak - COUNTER_SLACK


def largest_footprint(report: dict[str, Any]) -> int:
    """The largest footprint the run measured: evictions report the footprint they free, plus the final ones."""
    return max([e["bytes"] for e in report["events"] if e["kind"] == "evict"] + [m["footprint_bytes"] for m in report["models"]])


# ---------------------------------------------------------------- reports

def test_text_report(built: dict[str, Path]) -> None:
    proc = bench(built["mlp_ctx"], built["split_ctx"], "--reference", built["mlp"], "--reference", built["split"], "--memory-budget", "40M", "--cycles", 2)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # the QNN SDK's banner must not leak (nor go to stdout)
    lines = proc.stdout.splitlines()
    assert lines[0] == "ep         QNNExecutionProvider, 2 cycles, budget 40.0 MiB"
    for line, name in zip(lines[1:3], ["mlp_ctx", "split_ctx"]):
        assert re.fullmatch(rf"model      {name}: loads \d+\.\d\ds(, \d+\.\d\ds)*; run \d+\.\d ms; \d+ hits?, \d+ evictions?, 0 captures; "
                            rf"footprint {SIZE}; ok(; reloads saved -?\d+\.\d\ds vs loading the source \(\d+\.\d\ds\))?", line), line
    assert re.fullmatch(rf"memory     baseline {SIZE} \(EP start-up {SIZE}\), pool peak {SIZE}, process peak {SIZE}", lines[3]), lines[3]
    assert lines[4:] == ["result     ok"]


def test_json_report(built: dict[str, Path]) -> None:
    report = bench_json(built["mlp_ctx"], built["split_ctx"], built["mlp_ctx"], "--cycles", 3, "--seed", 5)
    check_report(report)
    assert report["ok"] is True and report["ep"] == "QNNExecutionProvider" and report["cycles"] == 3 and report["graph_capture"] is False
    assert [m["name"] for m in report["models"]] == ["mlp_ctx", "split_ctx", "mlp_ctx#2"]  # the same model twice: two entries
    assert [m["model"] for m in report["models"]] == [str(built["mlp_ctx"]), str(built["split_ctx"]), str(built["mlp_ctx"])]
    assert all(m["reference"] == "first run" and m["source_load_seconds"] is None for m in report["models"])
    # No budget: each model loads once, then hits.
    assert [(e["kind"], e["model"]) for e in report["events"]] == \
        [("load", "mlp_ctx"), ("load", "split_ctx"), ("load", "mlp_ctx#2")] + [("hit", "mlp_ctx"), ("hit", "split_ctx"), ("hit", "mlp_ctx#2")] * 2


def test_json_unlimited_budget_is_null() -> None:
    """Without --memory-budget the budget is unlimited: null in JSON (was 2**62, residency-5), "unlimited" in text."""
    report = bench_json(FIXTURES / "mlp.onnx", "--ep", "cpu", "--cycles", 1)
    check_report(report)
    assert report["memory_budget_bytes"] is None
    text = bench(FIXTURES / "mlp.onnx", "--ep", "cpu", "--cycles", 1)
    assert text.stdout.splitlines()[0] == "ep         CPUExecutionProvider, 1 cycles, budget unlimited"


def test_quiet_prints_nothing(built: dict[str, Path]) -> None:
    proc = bench(built["mlp_ctx"], "--cycles", 2, "-q")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


# ---------------------------------------------------------------- references

def test_reference_count_must_match_the_models(built: dict[str, Path]) -> None:
    proc = bench(built["mlp_ctx"], built["split_ctx"], "--reference", built["mlp"])
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert_one_line_error(proc.stderr, "--reference given 1 time for 2 models")


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_wrong_reference_fails_with_exit_5(as_json: bool, built: dict[str, Path]) -> None:
    """mlp_ctx checked against `other` (same input and output names, shapes, dtypes; other weights): every cycle
    mismatches; the correct pair in the same run stays ok; one stderr line; the report still printed."""
    proc = bench(built["split_ctx"], built["mlp_ctx"], "--reference", built["split"], "--reference", built["other"], "--cycles", 2,
                 *(["--json"] if as_json else []))
    assert proc.returncode == 5
    assert_one_line_error(proc.stderr, "mlp_ctx: output differs from its reference on 2 runs")
    if as_json:
        report = json.loads(proc.stdout)
        check_report(report)
        assert report["ok"] is False
        split, mlp = report["models"]
        assert split["mismatches"] == [] and mlp["reference"] == str(built["other"])
        assert [(m["run"], m["name"]) for m in mlp["mismatches"]] == [(1, "y"), (2, "y")]
        for m in mlp["mismatches"]:
            assert m["shape"] == [1, 256] and m["dtype"] == "float32" and m["max_abs"] > 0.1 and 0 < m["mismatches"] <= m["total"] == 256
            assert m["ok"] is False
            # Judged as verify judges QNN (fp16 parity): other weights are uncorrelated, far below 20 dB / 0.995.
            assert m["criterion"] == "parity" and m["snr_db"] < 3 and m["cosine"] < 0.5
            assert m["reason"].startswith(f"SNR {m['snr_db']:.1f} dB < 20 dB; ")
    else:
        lines = proc.stdout.splitlines()
        assert lines[1].startswith("model      split_ctx:") and lines[1].endswith("; ok")
        assert lines[2].startswith("model      mlp_ctx:") and "; 2 MISMATCHES" in lines[2]
        assert lines[-1] == "result     MISMATCH"


def test_right_references_pass_on_every_cycle(built: dict[str, Path]) -> None:
    report = bench_json(built["mlp_ctx"], built["split_ctx"], "--reference", built["mlp"], "--reference", built["split"], "--cycles", 3,
                        "--memory-budget", "1K")
    check_report(report)
    assert report["ok"] and all(m["reference"] == str(built[n]) for m, n in zip(report["models"], ["mlp", "split"]))
    assert all(m["loads"] == 3 and m["evictions"] >= 2 for m in report["models"])  # every step reloaded and still right


def test_reference_with_an_output_the_model_lacks_fails(built: dict[str, Path], tmp_path: Path) -> None:
    """The reference is mlp.onnx plus one more output (`r`, the hidden layer): the compiled model lost an
    output, which is a mismatch on every run (residency-2), while `y` itself matches."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(FIXTURES / "mlp.onnx"))
    model.graph.output.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 256]))
    onnx.save(model, str(tmp_path / "mlp_extra.onnx"))
    proc = bench(built["mlp_ctx"], "--reference", tmp_path / "mlp_extra.onnx", "--cycles", 2, "--json")
    assert proc.returncode == 5, proc.stderr
    assert_one_line_error(proc.stderr, "mlp_ctx: output differs from its reference on 2 runs")
    report = json.loads(proc.stdout)
    check_report(report)
    assert report["models"][0]["mismatches"] == [{"run": run, "name": "r", "ok": False, "reason": "missing from the model's outputs"} for run in (1, 2)]


def test_reference_with_other_input_names_is_a_one_line_error(built: dict[str, Path], tmp_path: Path) -> None:
    """Was an internal error (residency-3)."""
    import onnx

    model = onnx.load(str(FIXTURES / "mlp.onnx"))
    model.graph.input[0].name = "inp"
    for node in model.graph.node:
        node.input[:] = ["inp" if i == "x" else i for i in node.input]
    onnx.save(model, str(tmp_path / "renamed.onnx"))
    proc = bench(built["mlp_ctx"], "--reference", tmp_path / "renamed.onnx", "--cycles", 1)
    assert proc.returncode == 5, proc.stderr
    assert_one_line_error(proc.stderr, "mlp_ctx: its inputs ['x'] differ from the reference's ['inp']")


# ---------------------------------------------------------------- budgets and memory

@pytest.mark.parametrize(("text", "value"), [("40M", 40 << 20), ("40MiB", 40 << 20), ("40MB", 40_000_000), ("512K", 512 << 10),
                                             ("1G", 1 << 30), ("2GiB", 2 << 30), ("123456", 123456), ("7b", 7)])
def test_memory_budget_sizes(text: str, value: int) -> None:
    report = bench_json(FIXTURES / "mlp.onnx", "--ep", "cpu", "--cycles", 1, "--memory-budget", text)
    assert report["memory_budget_bytes"] == value


@pytest.mark.parametrize("text", ["40Q", "-1", "1.5G", "", "M", "40 M B"])
def test_bad_memory_budget_is_a_usage_error(text: str) -> None:
    proc = bench(FIXTURES / "mlp.onnx", "--ep", "cpu", "--memory-budget", text)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "is not a size" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("args", [["--cycles", "0"], ["--ep", "cpu", "--graph-capture"], ["--ep", "nope"]], ids=["cycles-0", "capture-on-cpu", "unknown-ep"])
def test_other_usage_errors(args: list[str]) -> None:
    proc = bench(FIXTURES / "mlp.onnx", *args)
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr


def test_missing_model_is_a_usage_error(tmp_path: Path) -> None:
    proc = bench(tmp_path / "missing.onnx", "--ep", "cpu")
    assert proc.returncode == 2
    assert_one_line_error(proc.stderr, "missing.onnx: no such model")


def test_reloads_of_compiled_models_save_time_against_sources(built: dict[str, Path]) -> None:
    """Budget 1K: every step reloads. Loading a source on QNN compiles it (measured: 0.4-0.6 s for these two);
    loading the compiled model deserializes the context (0.04-0.2 s). The report says how much the reloads saved,
    and memory stays within budget + one model (+ the QNN margin) as the pool promises."""
    report = bench_json(built["big1_ctx"], built["big2_ctx"], "--reference", built["big1"], "--reference", built["big2"], "--cycles", 3,
                        "--memory-budget", "1K")
    check_report(report)
    assert report["ok"]
    for m in report["models"]:
        assert m["reloads"] == 2 and m["source_load_seconds"] > 0
        mean_reload = sum(m["load_seconds"][1:]) / m["reloads"]
        assert mean_reload < m["source_load_seconds"], m
        assert m["reload_seconds_saved_vs_source"] > 0
    peak = report["pool_peak_rss_bytes"] - report["baseline_rss_bytes"]
    assert peak <= report["memory_budget_bytes"] + largest_footprint(report) + QNN_MARGIN, (peak, largest_footprint(report))
    print({m["name"]: (m["source_load_seconds"], m["load_seconds"], m["reload_seconds_saved_vs_source"], m["footprint_bytes"]) for m in report["models"]},
          f"peak - baseline {peak / MiB:.1f} MiB")


def test_peak_rss_within_budget_plus_one_model_with_references(built: dict[str, Path]) -> None:
    """A budget above the largest model and below the sum (the models are 12-48 MiB resident on QNN): evictions
    happen and the pool's peak stays within budget + the largest footprint + margin."""
    budget = 60 * MiB
    report = bench_json(built["big1_ctx"], built["big2_ctx"], built["mlp_ctx"], "--reference", built["big1"], "--reference", built["big2"],
                        "--reference", built["mlp"], "--cycles", 3, "--memory-budget", "60M")
    check_report(report)
    assert report["ok"]
    footprints = [m["footprint_bytes"] for m in report["models"]]
    assert sum(footprints) > budget, footprints
    assert sum(m["evictions"] for m in report["models"]) >= 2
    peak = report["pool_peak_rss_bytes"] - report["baseline_rss_bytes"]
    assert peak <= budget + largest_footprint(report) + QNN_MARGIN, (peak, largest_footprint(report))


def test_peak_rss_without_references_excludes_the_ep_start_up(built: dict[str, Path]) -> None:
    """No --reference: bench starts the EP (a one-node session) before the baseline and reports what that cost
    (QNN: ~90 MiB measured), so the peak over the baseline is the models' business only (residency-4)."""
    report = bench_json(built["mlp_ctx"], built["split_ctx"], built["big1_ctx"], "--cycles", 3, "--memory-budget", "1K")
    check_report(report)
    assert report["ep_startup_rss_bytes"] > 40 * MiB
    peak = report["pool_peak_rss_bytes"] - report["baseline_rss_bytes"]
    assert peak <= report["memory_budget_bytes"] + largest_footprint(report) + QNN_MARGIN, (peak, largest_footprint(report))


def test_pool_peak_sees_the_models_and_their_load_transients(built: dict[str, Path]) -> None:
    """Sources with inline weights (11.9 and 23.6 MiB) on the CPU EP, one at a time: the pool's peak over the
    baseline must show at least the larger model, and the process peak (ru_maxrss) must not be far above the
    pool peak: nothing before the baseline (CPU start-up ~19 MiB) peaks higher than the pool phase.
    Before residency-11 was fixed: pool peak == baseline (the baseline held freed heap), process peak 23 MiB above."""
    report = bench_json(built["big1"], built["big2"], "--ep", "cpu", "--memory-budget", "1K", "--cycles", 2)
    check_report(report)
    weights = Mlp("big2", 1760, 4).weight_bytes
    assert report["pool_peak_rss_bytes"] - report["baseline_rss_bytes"] >= 0.9 * weights, report
    assert report["process_peak_rss_bytes"] - report["pool_peak_rss_bytes"] <= COUNTER_SLACK, report


# ---------------------------------------------------------------- docs/pipelines.md stays true

PIPELINES_MD = Path(__file__).resolve().parent.parent / "docs" / "pipelines.md"


def _table(heading: str) -> set[str]:
    text = PIPELINES_MD.read_text()
    section = text.split(heading, 1)[1].split("\n#", 1)[0]
    return set(re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.M))


def test_docs_field_tables_match_the_json() -> None:
    assert _table("#### Report fields") == TOP_KEYS
    assert _table("#### Model fields") == MODEL_KEYS
    assert _table("#### Event fields") == {"kind", "model", "seconds", "bytes"}


def test_docs_python_example_prints_what_the_page_says(tmp_path: Path) -> None:
    import subprocess
    import sys

    text = PIPELINES_MD.read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    shown = text.split("prints (a test runs this block", 1)[1].split("```\n", 1)[1].split("```", 1)[0]
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=PIPELINES_MD.parent.parent)
    assert child.returncode == 0, child.stderr
    assert child.stdout == shown


def test_docs_example_output_has_the_current_format() -> None:
    """Every report line the page shows parses with the patterns the report tests use."""
    lines = [line for line in PIPELINES_MD.read_text().splitlines() if re.match(r"(ep|model|memory|result) {3,}", line)]
    assert len(lines) >= 10
    patterns = [
        r"ep         \w+( \(graph capture\))?, \d+ cycles, budget (" + SIZE + "|unlimited)",
        r"model      \w+: loads \d+\.\d\ds(, \d+\.\d\ds)*; run \d+\.\d ms; \d+ hits?, \d+ evictions?, \d+ captures?; footprint " + SIZE
        + r"; (ok|\d+ MISMATCHES)(; reloads saved -?\d+\.\d\ds vs loading the source \(\d+\.\d\ds\))?",
        rf"memory     baseline {SIZE} \(EP start-up {SIZE}\), pool peak {SIZE}, process peak {SIZE}",
        r"result     (ok|MISMATCH)",
    ]
    for line in lines:
        assert any(re.fullmatch(p, line) for p in patterns), line
