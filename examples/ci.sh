#!/usr/bin/env bash
# A model-packaging CI job: compile an ONNX model into an EPContext model, prove it, record what was built,
# and archive it reproducibly.
#
#   examples/ci.sh MODEL.onnx [ARTIFACT_DIR]          (ARTIFACT_DIR defaults to ./artifacts)
#
# Environment (all optional):
#   ORTCOMPILE   how to run ortcompile               (default: ortcompile)
#   EP           execution provider                  (default: the config file's, else auto = QNN when installed)
#   FIX_DIMS     symbolic dims to pin, "batch=1 seq=128" (NPU EPs need static shapes)
#   PRECISION    judge outputs as an EP of this precision: fp32, fp16, quantized (default: the EP's; QNN = fp16)
#   RTOL, ATOL   elementwise tolerances for --verify and verify (default: the precision's, docs/verify.md)
#   MIN_SNR      fp16/quantized: minimum SNR in dB (default: the precision's, 20 dB for fp16)
#   RUNS         seeded runs for the final verify    (default: 3)
#
# Per-model settings (EP, target, pins, options) can instead come from an ortcompile.toml or [tool.ortcompile]
# in pyproject.toml in the current directory or above (docs/config.md): one script for every model. EP and
# FIX_DIMS given here win over the file; verify takes the pins the compile used from the manifest.
#
# Produces, in ARTIFACT_DIR:
#   model/                 the compiled model: <stem>_ctx.onnx, .data, EP blob, manifest (exactly those files)
#   reports/compile.json   ortcompile compile --json (files, sizes, sha256, timings, peak RSS)
#   reports/inspect.json   ortcompile inspect --json (partitions, where every weight lives, alignment, manifest)
#   reports/verify.json    ortcompile verify --json  (integrity, load speed-up, output differences per seed)
#   <stem>_ctx.tar.gz      model/ as a reproducible archive: the same input gives the same archive bytes
#   SHA256SUMS             sha256 of the archive and the reports (`sha256sum -c SHA256SUMS` re-checks them)
#
# Exits non-zero on the first failing step, with ortcompile's exit code (docs/exit-codes.md):
#   1 compile failed · 2 bad usage / EP missing · 3 bad input model · 4 output problem · 5 verification mismatch.
# A failed step publishes nothing new: `compile --verify` renames the model into place only if it matched.

set -euo pipefail

MODEL=${1:?usage: ci.sh MODEL.onnx [ARTIFACT_DIR]}
ARTIFACTS=${2:-artifacts}
ARTIFACTS=${ARTIFACTS%/}  # "out/" and "out" alike
ORTCOMPILE=${ORTCOMPILE:-ortcompile}
ep=()
[[ -n ${EP:-} ]] && ep=(--ep "$EP")
RUNS=${RUNS:-3}

stem=$(basename "$MODEL" .onnx)
build="$ARTIFACTS/model"
reports="$ARTIFACTS/reports"
compiled="$build/${stem}_ctx.onnx"

tolerance=()
[[ -n ${PRECISION:-} ]] && tolerance+=(--precision "$PRECISION")
[[ -n ${RTOL:-} ]] && tolerance+=(--rtol "$RTOL")
[[ -n ${ATOL:-} ]] && tolerance+=(--atol "$ATOL")
[[ -n ${MIN_SNR:-} ]] && tolerance+=(--min-snr "$MIN_SNR")
pins=() dims=()
for dim in ${FIX_DIMS:-}; do pins+=(--fix-dim "$dim"); dims+=(--dim "$dim"); done

# step NAME REPORT COMMAND...: run one ortcompile step with its JSON on stdout saved as REPORT; on failure say
# which step and why (ortcompile's own one-line error is already on stderr), keep the report, and stop with
# ortcompile's exit code.
step() {
    local name=$1 report=$2 status=0
    shift 2
    echo "ci: $name" >&2
    "$@" > "$report" || status=$?
    if (( status != 0 )); then
        if [[ -s $report ]]; then
            echo "ci: $name failed (exit $status); see the error above and $report" >&2
        else
            rm -f "$report"  # failed before producing a report: the one-line error above says why
            echo "ci: $name failed (exit $status); see the error above" >&2
        fi
        exit "$status"
    fi
}

rm -rf "$build" "$reports" "$ARTIFACTS/${stem}_ctx.tar.gz" "$ARTIFACTS/SHA256SUMS"
mkdir -p "$reports"

# 1. Compile, checking the staged model against the source before it is published (exit 5, nothing
#    published, on mismatch). A fresh output directory: --force is not needed and stale files cannot leak in.
# shellcheck disable=SC2086  # ORTCOMPILE may be a command with arguments ("python -m ortcompile")
step compile "$reports/compile.json" \
    $ORTCOMPILE compile "$MODEL" -o "$build" "${ep[@]}" "${pins[@]}" --verify "${tolerance[@]}" --json

# 2. Record what was built, and gate on it: --check hashes every file against the manifest (exit 5 on any
#    missing, short, unsafe or changed file). The JSON is written either way.
# shellcheck disable=SC2086
step inspect "$reports/inspect.json" $ORTCOMPILE inspect "$compiled" --check --json

# 3. The acceptance test an app would run: plain onnxruntime sessions, integrity + outputs vs the source on
#    several seeds, and how much faster the compiled model loads.
# shellcheck disable=SC2086
step verify "$reports/verify.json" \
    $ORTCOMPILE verify "$compiled" --reference "$MODEL" --runs "$RUNS" "${dims[@]}" "${tolerance[@]}" --json

# 4. Archive. Fixed order, owner and mtime, and gzip without a timestamp: ortcompile's outputs are
#    byte-identical for the same input, so the archive is too (a cache or a release can key on its sha256).
echo "ci: archive" >&2
tar -C "$ARTIFACTS" --sort=name --mtime='@0' --owner=0 --group=0 --numeric-owner -cf - model \
    | gzip -n > "$ARTIFACTS/${stem}_ctx.tar.gz"
(cd "$ARTIFACTS" && sha256sum "${stem}_ctx.tar.gz" reports/compile.json reports/inspect.json reports/verify.json > SHA256SUMS)
echo "ci: ok: $ARTIFACTS/${stem}_ctx.tar.gz" >&2
