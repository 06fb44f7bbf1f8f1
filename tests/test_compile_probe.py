"""The EP-context write-callback question (compile/ortstep.py): asked with a one-node compile once per process, or
answered from KNOWN_CALLBACK_SUPPORT for an EP version whose answer was measured (every compile's worker is a fresh
process: the probe cost 0.04-0.06 CPU s of each small QNN compile). The recorded answer must be what the EP says."""

from __future__ import annotations

import onnxruntime as ort
import pytest

from ortcompile import child
from ortcompile.compile import ortstep
from ortcompile.eps import resolve


def test_the_recorded_answer_is_what_the_installed_ep_says() -> None:
    ep = resolve("qnn")
    key = (ep.name, ep.version, ort.__version__)
    if key not in ortstep.KNOWN_CALLBACK_SUPPORT:
        pytest.skip(f"no recorded answer for {key}: the worker asks (record it in ortstep.KNOWN_CALLBACK_SUPPORT)")
    assert ortstep.ask_write_callback_support(ep) is ortstep.KNOWN_CALLBACK_SUPPORT[key]


def test_a_recorded_answer_runs_no_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    ep = resolve("qnn")
    if (ep.name, ep.version, ort.__version__) not in ortstep.KNOWN_CALLBACK_SUPPORT:
        pytest.skip("no recorded answer for the installed QNN EP")
    monkeypatch.setattr(ortstep, "_CALLBACK_SUPPORT", {})
    monkeypatch.setattr(child, "_ep_ran_here", False)
    assert ortstep.ep_supports_write_callback(ep) is False
    assert not child._ep_ran_here  # the probe builds QNN session options, which note it: it did not run


def test_an_unrecorded_version_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    ep = resolve("qnn")
    monkeypatch.setattr(ortstep, "_CALLBACK_SUPPORT", {})
    monkeypatch.setattr(ortstep, "KNOWN_CALLBACK_SUPPORT", {})
    monkeypatch.setattr(child, "_ep_ran_here", False)
    supported = ortstep.ep_supports_write_callback(ep)
    assert child._ep_ran_here  # the probe ran: it built QNN session options
    assert ortstep._CALLBACK_SUPPORT[ep.name] is supported is ortstep.ask_write_callback_support(ep)


def test_the_callers_own_process_always_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    """compile_to_buffers compiles in the caller's process: there the probe is where QNN starts, under the output
    redirect (its banner would otherwise reach the program's stdout from an abandoned compile)."""
    ep = resolve("qnn")
    monkeypatch.setattr(ortstep, "_CALLBACK_SUPPORT", {})
    monkeypatch.setattr(child, "_ep_ran_here", False)
    assert ortstep.ep_supports_write_callback(ep, recorded=False) is ortstep.ask_write_callback_support(ep)
    assert child._ep_ran_here
