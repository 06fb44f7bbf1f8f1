"""Finding plugin EP packages by convention, names, `--ep-library`: with the real installed packages.

The package installed at test time is a real Python package written into a temporary directory put on
PYTHONPATH: it follows the plugin convention and hands out the QNN EP's library (registered under its own
EP name, which the QNN library adopts), so discovery, resolution and a real compile run end to end for an
EP ortcompile has no data on. Nothing here is mocked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import FIXTURES

from ortcompile import eps
from ortcompile.eps.catalog import short_name_for
from ortcompile.eps.discovery import read_plugin_source
from ortcompile.errors import UsageError


def child(code: str, **env: str) -> dict:
    """Run `code` in a fresh interpreter (discovery caches per process); it prints one JSON line last."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_resolve_pipeline_stays_off_the_up_to_date_path() -> None:
    """--if-changed asks discovery which EP a compile would use: none of resolve's stages (their records cost start-up
    time) nor onnxruntime's side of eps/ is imported for it."""
    imported = child("""
        import json, sys
        from ortcompile.eps.discovery import choose_ep
        choose_ep("qnn").expected(), choose_ep("auto").expected()
        print(json.dumps(sorted(m for m in sys.modules if m.startswith("ortcompile.eps."))))
    """)
    stages = {f"ortcompile.eps.{m}" for m in ("ask", "loading", "matching", "resolution", "registry", "validate", "resolved")}
    assert imported and not stages & set(imported), imported


@pytest.mark.parametrize("ep_name, short", [
    ("QNNExecutionProvider", "qnn"), ("OpenVINOExecutionProvider", "openvino"), ("WebGpuExecutionProvider", "webgpu"),
    ("NvTensorRTRTXExecutionProvider", "nvtensorrtrtx"), ("CPUExecutionProvider", "cpu"), ("MyNPU_v2ExecutionProvider", "mynpuv2"),
])
def test_short_name_rule(ep_name: str, short: str) -> None:
    assert short_name_for(ep_name) == short


@pytest.mark.parametrize("name", ["nvtrtrtx", "trtrtx", "tensorrt-rtx", "NvTensorRTRTXExecutionProvider", "nvtensorrtrtx"])
def test_tensorrt_rtx_names_all_resolve_to_one_ep(name: str) -> None:
    assert eps.lookup(name).ep_name == "NvTensorRTRTXExecutionProvider"


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(UsageError) as caught:
        eps.lookup("tpu")
    assert "unknown execution provider 'tpu'" in caught.value.message and "qnn" in caught.value.message
    assert "--ep-library" in caught.value.message


def test_installed_packages_found_from_source_without_importing_onnxruntime() -> None:
    found = child("""
        import json, sys, time
        start = time.perf_counter()
        from ortcompile.eps import installed_plugins, lookup
        plugins = {p.module: list(p.ep_names) for p in installed_plugins()}
        qnn = lookup("qnn")
        print(json.dumps({"plugins": plugins, "ms": (time.perf_counter() - start) * 1000,
                          "imported": sorted(m for m in sys.modules if m.startswith("onnxruntime"))}))
    """)
    assert found["imported"] == []  # neither onnxruntime nor any plugin package was imported
    assert found["plugins"]["onnxruntime_qnn"] == ["QNNExecutionProvider"]
    for module, ep_name in [("onnxruntime_ep_openvino", "OpenVINOExecutionProvider"), ("onnxruntime_ep_webgpu", "WebGpuExecutionProvider"),
                            ("onnxruntime_ep_nv_tensorrt_rtx", "NvTensorRTRTXExecutionProvider")]:
        if module in found["plugins"]:
            assert found["plugins"][module] == [ep_name]
    assert found["ms"] < 1000, found["ms"]


PLUGIN_INIT = '''
"""A plugin EP package made at test time: the QNN EP's library under another EP name."""
import onnxruntime_qnn

EP_NAME = "TinyNpuExecutionProvider"


def get_library_path():
    return onnxruntime_qnn.get_library_path()


def get_ep_names():
    return [EP_NAME]


def get_htp_backend():
    return onnxruntime_qnn.get_qnn_htp_path()
'''


@pytest.fixture
def tiny_plugin(tmp_path: Path) -> Path:
    package = tmp_path / "site" / "onnxruntime_ep_tinynpu"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(PLUGIN_INIT)
    return tmp_path / "site"


def test_plugin_installed_at_test_time_is_discovered_resolved_and_compiles(tiny_plugin: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = child(f"""
        import json, warnings
        warnings.simplefilter("ignore")
        import onnxruntime_qnn
        from ortcompile import CompileOptions, compile_model, eps
        listed = {{e.short_name: e.to_json() for e in eps.list_eps()}}
        info = eps.lookup("tinynpu")
        options = {{"backend_path": onnxruntime_qnn.get_qnn_htp_path(), "soc_model": "60"}}
        resolved = eps.resolve("TinyNpuExecutionProvider", options)
        # --check none: QNN's library registered under another name writes EPContext nodes whose source it does
        # not answer to at load time; the pre-publish check (tested elsewhere) would rightly refuse to publish them.
        compiled = compile_model({str(FIXTURES / "mlp.onnx")!r}, {str(out)!r}, CompileOptions(ep="tinynpu", ep_options=options, check="none"))
        print(json.dumps({{"listed": listed.get("tinynpu"), "known": info.known, "compiles": info.compiles, "module": info.module,
                          "devices": len(resolved.devices), "epcontext": compiled.epcontext_nodes, "ep": compiled.ep}}))
    """, PYTHONPATH=f"{tiny_plugin}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    assert result["known"] is False and result["compiles"] is True and result["module"] == "onnxruntime_ep_tinynpu"
    assert result["listed"]["ep_name"] == "TinyNpuExecutionProvider" and result["listed"]["available"] is True
    assert result["listed"]["known"] is False
    assert result["devices"] == 1
    assert result["epcontext"] == 1 and result["ep"] == "TinyNpuExecutionProvider"


def test_a_module_without_the_convention_is_not_a_plugin(tmp_path: Path) -> None:
    init = tmp_path / "__init__.py"
    init.write_text('"""QNNExecutionProvider in a docstring only."""\ndef get_library_path():\n    return "x"\n')
    assert read_plugin_source("onnxruntime_notaplugin", str(init)) is None
    init.write_text('"""Mentions CPUExecutionProvider."""\nX = "FooExecutionProvider"\n'
                    'def get_library_path():\n    return "x"\ndef get_ep_names():\n    return [X]\n')
    assert read_plugin_source("onnxruntime_foo", str(init)).ep_names == ("FooExecutionProvider",)


def test_ep_library_registers_the_webgpu_plugin_by_path(tmp_path: Path) -> None:
    """--ep-library PATH --ep EPNAME: the WebGPU plugin's own library, registered by path, not by package."""
    pytest.importorskip("onnxruntime_ep_webgpu")
    import webgpu_env

    result = child("""
        import json, warnings
        import onnxruntime_ep_webgpu
        from ortcompile import eps
        from ortcompile.errors import OrtCompileError
        path = onnxruntime_ep_webgpu.get_library_path()
        resolved = eps.resolve("WebGpuExecutionProvider", library=path)
        wrong = ""
        try:
            eps.resolve("NotWebGpuExecutionProvider", library=path)
        except OrtCompileError as exc:
            wrong = exc.message
        print(json.dumps({"short": resolved.info.short_name, "library": resolved.info.library, "module": resolved.info.module,
                          "compiles": resolved.info.compiles, "devices": len(resolved.devices), "path": path,
                          "version": resolved.version, "wrong": wrong}))
    """, **webgpu_env.env())
    assert result["short"] == "webgpu" and result["library"] == result["path"] and result["module"] is None
    assert result["compiles"] is False  # the catalog's knowledge applies to a library registered by path too
    assert result["devices"] == 1 and result["version"] == "0.4.0"
    assert "claims no device" in result["wrong"] and "--ep WebGpuExecutionProvider" in result["wrong"]


def test_ep_library_with_a_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such file"):
        eps.resolve("WebGpuExecutionProvider", library=str(tmp_path / "nope.so"))


def test_compile_with_ep_library(tmp_path: Path) -> None:
    """The whole compile path with a library registered by path: QNN's library, no package import, the backend
    given as an option (only a package can tell ortcompile where QNN's backend library is)."""
    out = tmp_path / "out"
    result = child(f"""
        import json, warnings
        warnings.simplefilter("ignore")
        import onnxruntime_qnn
        from ortcompile import CompileOptions, compile_model
        options = CompileOptions(ep="QNNExecutionProvider", ep_library=onnxruntime_qnn.get_library_path(),
                                 ep_options={{"backend_path": onnxruntime_qnn.get_qnn_htp_path()}})
        result = compile_model({str(FIXTURES / "mlp.onnx")!r}, {str(out)!r}, options)
        manifest = json.loads((result.output_dir / "mlp_ctx.manifest.json").read_text())
        print(json.dumps({{"ep": result.ep, "epcontext": result.epcontext_nodes, "target": manifest.get("target")}}))
    """)
    assert result["ep"] == "QNNExecutionProvider" and result["epcontext"] == 1
    assert result["target"]["name"] == "sc8380xp"  # the catalog's data (default target) applies to the library too
