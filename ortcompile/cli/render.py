"""Human-readable text for inspect, placement, verify and bench reports.

Each is rendered from the report's JSON document (its to_json, what --json prints), so the two forms never disagree:
the JsonObject parameters here are that document, at the edge.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from ortcompile.eps.catalog import short_name_for
from ortcompile.jsonedge import JsonObject
from ortcompile.sizes import format_size


def plural(count: int, noun: str) -> str:
    """'1 file', '2 files': counts in messages read as English."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def human_size(size: int | None) -> str:
    return "-" if size is None else format_size(size)


def _shape(io: JsonObject) -> str:
    return "[" + ",".join(str(d) if isinstance(d, int) else f"{d}*" for d in io["shape"]) + "]"


def inspect_text(report: JsonObject) -> list[str]:
    lines = [
        f"model      {report['model']}",
        f"graph      {human_size(report['graph_bytes'])} proto, {human_size(report['protobuf_headroom_bytes'])} below the 2 GiB limit",
        "opsets     " + ", ".join(f"{d} {v}" for d, v in sorted(report["opsets"].items()))
        + (f" ({len(report['unused_opsets'])} more imported, used by no node)" if report["unused_opsets"] else ""),
    ]
    for kind in ("inputs", "outputs"):
        for io in report[kind]:
            lines.append(f"{kind[:-1]:<10} {io['name']} {io['dtype']}{_shape(io)}{'  (* symbolic)' if io['dynamic'] else ''}")
    nodes = report["nodes"]
    known = nodes["compiled_ops"] is not None
    compiled = (_ops(nodes["compiled_ops"]) or "none") if known else "unknown without a manifest"
    remaining = _ops(nodes["remaining_ops"]) or "none"
    lines += [f"nodes      {nodes['epcontext']} EPContext; compiled: {compiled}; remaining: {remaining}"]
    for node in report["epcontext_nodes"]:
        where = f"embedded {human_size(node['embedded_bytes'])}" if node["embed_mode"] else _blob(node["blob"])
        lines.append(f"epcontext  {node['name'] or '-'}: {node['source']} main={node['main_context']} embed={node['embed_mode']} "
                     f"{where} sdk={node['ep_sdk_version'] or '-'} partition={node['partition_name']}")
    inits = report["initializers"]
    lines.append(f"weights    {inits['inline']} inline ({human_size(inits['inline_bytes'])}), {inits['external']} external")
    for use in inits["files"]:
        state = "MISSING" if use["missing"] else "UNSAFE PATH" if use["unsafe_path"] else "SHORT" if use["short"] else human_size(use["size"])
        lines.append(f"  file     {use['name']}: {plural(use['tensors'], 'tensor')}, {human_size(use['referenced_bytes'])} referenced, {state}"
                     + (" (shared with other models)" if use.get("shared") else ""))
    align = report["alignment"]
    lines.append(f"alignment  {align['aligned']}/{align['large_tensors']} tensors >= {human_size(align['threshold'])} at {align['align']}-byte offsets")
    for item in align["unaligned"]:
        lines.append(f"  unaligned {item['name']} in {item['file']} at {item['offset']}")
    if report.get("target"):
        target = report["target"]
        options = " ".join(f"{k}={v}" for k, v in target.get("options", {}).items())
        marks = f"{' (default)' if target.get('default') else ''}{' (virtual)' if target.get('virtual') else ''}"
        lines.append(f"target     {target['name']}{marks} {options}".rstrip())
    for part in report.get("parts") or []:
        remaining = _ops(part["remaining_ops"])
        lines.append(f"part       {part['model']}: nodes {part['nodes'][0]}-{part['nodes'][1] - 1}, {human_size(part['weight_bytes'])} of weights, "
                     f"{plural(part['epcontext'], 'EPContext node')}{'; on CPU: ' + remaining if remaining else ''}")
    for ep, compat in report.get("compatibility", {}).items():
        decoded = compat["decoded"]
        shown = ", ".join(f"{k} {v}" for k, v in decoded.items() if k not in ("format",) and v not in ("", None, [], False)) if decoded else compat["info"]
        lines.append(f"compiled   for {ep}: {shown} (ortcompile check says whether it fits this machine)")
    manifest = report["manifest"]
    if manifest is None:
        lines.append("manifest   none")
    else:
        how = "sizes and sha256" if manifest["hashed"] else "sizes only (--check hashes)"
        lines.append(f"manifest   {manifest['path']}: {'ok' if manifest['ok'] else 'PROBLEMS'} ({how}, {plural(len(manifest['files']), 'file')})")
    lines += [f"problem    {p}" for p in report["problems"]]
    return lines


def _ops(counts: dict[str, int] | None) -> str:
    """'Mod 1, Sinh 1': op type counts as one phrase."""
    return ", ".join(f"{op} {n}" for op, n in (counts or {}).items())


def placement_text(placement: JsonObject) -> list[str]:
    """`inspect --placement`: the session's EP, each EP's nodes by op type, what the EP refused and why."""
    target = f" (target {placement['target']})" if placement["target"] else ""
    lines = [f"placement  opened on {placement['ep']}{target} in {placement['session_seconds']:.2f}s"]
    for ep, entry in _ep_first(placement["eps"], placement["ep"]):
        lines.append(f"  ep       {ep}: {plural(len(entry['nodes']), 'node')} ({_ops(entry['ops'])})")
    refused = placement["refused"]
    if refused is None:
        return lines
    if not refused:
        return [*lines, f"refused    nothing: {placement['ep']} takes every node"]
    how = "left them out of its EPContext nodes when compiling" if placement["compiled"] else "did not take them"
    lines.append(f"refused    {_ops(refused)}: {placement['ep']} {how}; they run on the CPU EP")
    lines += [f"  reason   {r['op_type']}{' ' + repr(r['name']) if r['name'] else ''}: {r['reason']}" for r in placement["reasons"]]
    if placement["compiled"] and not placement["reasons"]:
        lines.append("  reason   not kept in a compiled model: 'ortcompile inspect SOURCE --placement --ep EP' shows the EP's reasons")
    return lines


def _ep_first(by_ep: JsonObject, ep: str) -> list[tuple[str, Any]]:
    """The EP the model was opened on (or compiled for) first, then the others (the CPU EP) by name."""
    return sorted(by_ep.items(), key=lambda item: (item[0] != ep, item[0]))


def compile_placement(result: JsonObject) -> list[str]:
    """`compile -v`: which EP runs which nodes (the pre-publish check's session) and what the EP refused."""
    if result["up_to_date"]:
        return []
    name = Path(result["source"]).name
    compiled = f", compiled from {_ops(result['compiled_ops'])}" if result["compiled_ops"] else ""
    placement = (result["check"] or {}).get("placement")
    if not placement:
        return [f"{name}: placement not checked (no pre-publish check ran): {plural(result['epcontext_nodes'], 'EPContext node')}{compiled}; "
                f"left outside them: {_ops(result['remaining_ops']) or 'nothing'}"]
    lines = [f"{name}: {ep} runs {plural(sum(ops.values()), 'node')} ({_ops(ops)}{compiled if 'EPContext' in ops else ''})"
             for ep, ops in _ep_first(placement, result["ep"])]
    if result["epcontext_nodes"] and result["remaining_ops"]:
        why = f"ortcompile inspect {shlex.quote(result['source'])} --placement --ep {short_name_for(result['ep'])}"
        fallback = result.get("fallback") or {}
        pinned = [*fallback.get("op_types", []), *(f"node {n}" for n in fallback.get("cut", []))]
        reason = f"kept off it: {', '.join(pinned)} (--cpu-nodes/--fallback); '{why}' shows the rest's reasons" if pinned else f"'{why}' shows its reasons"
        lines.append(f"{name}: {result['ep']} refused {_ops(result['remaining_ops'])}; they run on the CPU EP ({reason})")
    return lines


def _blob(blob: JsonObject | None) -> str:
    if not blob:
        return "no blob (refers to the main context)"
    state = "MISSING" if blob["missing"] else "UNSAFE PATH" if blob["unsafe_path"] else human_size(blob["size"])
    shared = ", shared EP context: other models use it too" if blob.get("shared") else ""
    return f"file {blob['location']} ({state}{shared})"


def verify_text(report: JsonObject) -> list[str]:
    integrity = report["integrity"]
    if not integrity["found"]:
        lines = ["integrity  no manifest beside the model: files not checked"]
    else:
        lines = [f"integrity  {'ok' if integrity['ok'] else 'FAILED'}: {plural(len(integrity['files']), 'file')}, sizes and sha256"]
        lines += [f"  problem  {p}" for p in integrity["problems"]]
    lines += [f"  problem  {p}" for p in integrity.get("referenced_files_problems", [])]
    if report.get("reference_note"):
        lines.append(f"reference  {report['reference_note']}")
    if report["dims"]:
        guessed = report.get("guessed_dims", {})
        shown = ", ".join(f"{k}={v}{' (guessed)' if k in guessed else ''}" for k, v in report["dims"].items())
        lines.append(f"dims       {shown} (--dim to set)")
    lines += [f"inputs     {note}" for note in report.get("inputs", [])]
    seconds = report["session_seconds"]
    if "compiled" in seconds:
        line = f"load       compiled {seconds['compiled']:.2f}s on {report['ep']}"
        if seconds.get("source_on_ep") is not None:
            line += f", source {seconds['source_on_ep']:.2f}s on the same EP"
        speedup = report["load_speedup"]
        if speedup:
            line += f" ({speedup}x faster)" if speedup >= 1 else f" ({1 / speedup:.2f}x slower)"
        lines.append(line)
    lines.append(f"criterion  {report['criterion']['describe']}")
    for run in report["runs"]:
        for out in run["outputs"]:
            where = f"seed={run['seed']}" if run.get("set", "seed ").startswith("seed ") else f"set={run['set']!r}"
            lines.append(f"output     {out['name']} {where}: {'ok' if out['ok'] else 'MISMATCH'}, {_metrics(out)}")
    if report.get("warning"):
        lines.append(f"warning    {report['warning']}")
    lines.append("result     " + ("ok" if report["ok"] else f"FAILED: {report['failure']}"))
    return lines


def _metrics(out: JsonObject) -> str:
    """The numbers that decided an output: tolerance counts, or the parity metrics that were measured."""
    if out["max_abs"] is None:
        return out["reason"]
    parts = [f"max abs {out['max_abs']:.3g}", f"{out['mismatches']}/{out['total']} outside tolerance"]
    if out.get("exact"):
        parts.append("identical")
    for key, label, fmt in (("snr_db", "SNR", "{:.1f} dB"), ("cosine", "cosine", "{:.5f}"), ("top1", "top-1", "{:.0%}")):
        if out.get(key) is not None:
            parts.append(f"{label} {fmt.format(out[key])}")
    text = ", ".join(parts)
    return text + (f" ({out['reason']})" if out["reason"] and not out["ok"] else "") + (f"; {out['note']}" if out.get("note") else "")


def bench_text(report: JsonObject) -> list[str]:
    budget = report["memory_budget_bytes"]
    lines = [f"ep         {report['ep']}{' (graph capture)' if report['graph_capture'] else ''}, {report['cycles']} cycles, "
             f"budget {human_size(budget) if budget is not None else 'unlimited'}"]
    for m in report["models"]:
        loads = ", ".join(f"{s:.2f}s" for s in m["load_seconds"])
        run = f"{m['mean_run_seconds'] * 1000:.1f} ms" if m["mean_run_seconds"] is not None else "-"
        line = (f"model      {m['name']}: loads {loads}; run {run}; {plural(m['hits'], 'hit')}, {plural(m['evictions'], 'eviction')}, "
                f"{plural(m['captures'], 'capture')}; footprint {human_size(m['footprint_bytes'])}; "
                f"{'ok' if not m['mismatches'] else str(len(m['mismatches'])) + ' MISMATCHES'}")
        if m["reload_seconds_saved_vs_source"] is not None:
            line += f"; reloads saved {m['reload_seconds_saved_vs_source']:.2f}s vs loading the source ({m['source_load_seconds']:.2f}s)"
        lines.append(line)
    lines.append(f"memory     baseline {human_size(report['baseline_rss_bytes'])} (EP start-up {human_size(report['ep_startup_rss_bytes'])}), "
                 f"pool peak {human_size(report['pool_peak_rss_bytes'])}, process peak {human_size(report['process_peak_rss_bytes'])}")
    lines.append("result     " + ("ok" if report["ok"] else "MISMATCH"))
    return lines
