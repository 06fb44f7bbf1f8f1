"""`ortcompile.load_session`: a compiled model loads in three lines, on the EP, options and target it was compiled for.

Real onnxruntime and the real QNN EP. The docs' "Loading a compiled model" snippets (ortcompile's and plain
onnxruntime's) are run here on a fresh compile, each in a fresh process.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import onnxruntime as ort
import pytest
from helpers import FIXTURES, REPO, max_abs_diff_vs_cpu

import ortcompile
from ortcompile import CompileOptions, compile_model
from ortcompile.errors import InvalidModel, UsageError

QNN = "QNNExecutionProvider"
SDK_BANNER = " # LIBNATIVE:"  # the QNN SDK's printf when its backend loads (onnxruntime-qnn 2.7.0)


@pytest.fixture(scope="module")
def split_output(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("build")
    return compile_model(FIXTURES / "split.onnx", out, CompileOptions(ep="qnn", embed="never")).model_path


def copy_without_manifest(model: Path, directory: Path) -> Path:
    directory.mkdir()
    for path in model.parent.iterdir():
        if not path.name.endswith(".manifest.json"):
            shutil.copyfile(path, directory / path.name)
    return directory / model.name


def test_loads_on_the_ep_it_was_compiled_for_and_computes_the_source(split_output: Path) -> None:
    session = ortcompile.load_session(split_output)
    assert session.get_providers()[0] == QNN
    options = session.get_provider_options()[QNN]
    assert options["soc_model"] == "60" and options["backend_path"].endswith("libQnnHtp.so")  # the manifest's target, QNN's backend
    max_abs_diff_vs_cpu(session, FIXTURES / "split.onnx", seeds=range(3))


def test_without_a_manifest_the_epcontext_source_names_the_ep(split_output: Path, tmp_path: Path) -> None:
    session = ortcompile.load_session(copy_without_manifest(split_output, tmp_path / "bare"))
    assert session.get_providers()[0] == QNN
    max_abs_diff_vs_cpu(session, FIXTURES / "split.onnx", seeds=[0])


def test_options_and_session_options_are_the_callers_on_top_of_the_manifests(split_output: Path) -> None:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ortcompile.load_session(split_output, ep_options={"htp_performance_mode": "burst"}, session_options=options)
    provider = session.get_provider_options()[QNN]
    assert provider["htp_performance_mode"] == "burst" and provider["soc_model"] == "60"
    assert session.get_session_options().intra_op_num_threads == 1
    retargeted = ortcompile.load_session(split_output, target="sm8650")
    assert retargeted.get_provider_options()[QNN]["soc_model"] == "57"


def test_a_cpu_compile_loads_on_the_cpu_ep(tmp_path: Path) -> None:
    result = compile_model(FIXTURES / "mlp.onnx", tmp_path, CompileOptions(ep="cpu"))
    session = ortcompile.load_session(result.model_path)
    assert session.get_providers() == ["CPUExecutionProvider"]
    assert ortcompile.load_session(FIXTURES / "mlp.onnx").get_providers() == ["CPUExecutionProvider"]  # no EPContext, no manifest


def test_errors_say_what_is_wrong(split_output: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidModel, match="no such file"):
        ortcompile.load_session(tmp_path / "missing_ctx.onnx")
    with pytest.raises(UsageError, match="unknown execution provider 'nosuch'"):
        ortcompile.load_session(split_output, ep="nosuch")
    broken = copy_without_manifest(split_output, tmp_path / "broken")
    broken.with_name("split_ctx.manifest.json").write_text("{not json")
    with pytest.raises(InvalidModel, match="unreadable manifest"):
        ortcompile.load_session(broken)


def test_import_stays_light() -> None:
    code = "import sys, ortcompile; ortcompile.load_session; print(sorted(m for m in ('onnx', 'onnxruntime') if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr


def loading_snippets() -> list[tuple[str, str]]:
    text = (REPO / "docs" / "output-layout.md").read_text()
    section = text.split("## Loading a compiled model", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(\w*)\n(.*?)```", section, flags=re.S)
    return [(body, blocks[i + 1][1]) for i, (lang, body) in enumerate(blocks) if lang == "python"]


def test_the_docs_loading_snippets_run(tmp_path: Path) -> None:
    snippets = loading_snippets()
    assert len(snippets) == 2 and "ortcompile.load_session" in snippets[0][0] and "import ortcompile" not in snippets[1][0]
    compile_model(FIXTURES / "split.onnx", tmp_path / "build", CompileOptions(ep="qnn"))
    for code, expected in snippets:
        proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"{code}\n{proc.stderr[-3000:]}"
        printed = [line for line in proc.stdout.splitlines(keepends=True) if not line.startswith(SDK_BANNER)]
        assert "".join(printed) == expected, f"{code} printed:\n{proc.stdout}"
