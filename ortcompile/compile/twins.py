"""The check of a `--share-weights` batch where this machine cannot load its shared EP context.

QNN's HTP simulator on x86 cannot load a shared context, which is where such batches are usually built (a CI job
cross-compiling for a phone): without this, the batch would be published with no check at all, and a model fp16
computes wrong would go out with exit 0. Instead each model is compiled again on its own (no sharing: the same graph,
the same EP and options, its own context, which the simulator loads) into the stage and checked as any compile is.
The shared context holds the same graphs, compiled by the same EP; only the weights' storage differs. What was
checked, and on what, is said in each manifest's `check` record (`on`).

Only a check that runs the model (`run`) needs this: opening an unshared twin would prove nothing of the shared one,
so a load-only check stays what it was, skipped with a warning.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

from ortcompile.compile.compilejob import CompileJob
from ortcompile.compile.finish import CheckOutcome
from ortcompile.compile.partpool import CompileOne
from ortcompile.errors import CompilationFailed, OrtCompileWarning, VerificationFailed
from ortcompile.options import ALL_PLACEMENT_OPTIONS
from ortcompile.output.manifest import CheckRecord, Manifest
from ortcompile.readback.nextsteps import next_steps

TWINS_DIR = "unshared"  # inside the stage: never published, removed with it
ON_TWIN = "the model compiled without --share-weights: {reason}"
NEXT = "; next: "  # where a refusal's next steps begin (readback/nextsteps.py)


def checked_on_twins(jobs: list[CompileJob], staging_dir: Path, reason: str, compile_one: CompileOne) -> list[CheckOutcome] | None:
    """Each model's check, run on its unshared twin (compiled by `compile_one`: job.compile_model, as any model); None
    when no model's check runs it (load-only or none). A model of the batch whose check would only load it is left
    unchecked, said in a warning."""
    if not any(job.plan.check.mode == "run" for job in jobs):
        return None
    skipped = [job.plan.target.names.model for job in jobs if job.plan.check.mode == "load"]
    if skipped:
        warnings.warn(f"{', '.join(skipped)}: not checked before publishing: {reason}", OrtCompileWarning, stacklevel=2)
    return [_check_twin(job, staging_dir / TWINS_DIR / str(index), reason, compile_one) if job.plan.check.mode == "run"
            else CheckOutcome(CheckRecord("none", None, reason=reason), None) for index, job in enumerate(jobs)]


def _check_twin(job: CompileJob, directory: Path, reason: str, compile_one: CompileOne) -> CheckOutcome:
    plan = job.plan
    job.reporter.stage(f"checking {plan.source.path.name}: compiled without sharing ({reason})")
    options = dataclasses.replace(plan.options, share_weights=False, output_name=None, force=True, verify=False, check="run",
                                  compatibility=False)  # (nobody reads the twin's fit to this machine's devices)
    try:
        with warnings.catch_warnings():  # the batch's own compile said them already
            warnings.simplefilter("ignore", OrtCompileWarning)
            result = compile_one(plan.source.path, directory, options)  # (saying nothing: no reporter)
    except (CompilationFailed, VerificationFailed) as exc:
        raise _refusal(exc, reason, options.refusal_offers()) from exc
    manifest = Manifest.load(result.output_dir / plan.target.names.manifest)
    record = dataclasses.replace(manifest.check or CheckRecord.from_json({}), on=ON_TWIN.format(reason=reason))
    return CheckOutcome(record, result.check, seconds=sum(result.timings.get(k, 0.0) for k in ("compile", "check")))


def _refusal(exc: CompilationFailed | VerificationFailed, reason: str, offers: tuple[str, ...]) -> CompilationFailed | VerificationFailed:
    """The twin's refusal, said of the batch, whose next steps differ: keeping nodes off the EP needs a compile
    without --share-weights (the batch refuses --cpu-nodes and --fallback), as far as the twin's command takes them
    (`offers`: the options its command takes; none for `ortcompile llm`'s graphs)."""
    if NEXT not in exc.message:  # it did not load, or crashed: said as it is
        return exc
    failure = exc.message.split(NEXT, 1)[0]
    flags = {("cpu_nodes", "fallback"): "--fallback auto (or --cpu-nodes NODE)", ("cpu_nodes",): "--cpu-nodes NODE",
             ("fallback",): "--fallback auto"}.get(tuple(sorted(set(offers) & set(ALL_PLACEMENT_OPTIONS))))
    step = (f"compile {exc.message.split(':', 1)[0]} without --share-weights and with {flags} to keep the diverging nodes on the CPU EP"
            if flags else None)
    error = type(exc)(f"{failure} (checked on {ON_TWIN.format(reason=reason)}){NEXT}"
                      f"{next_steps('check', first=step, offers=offers).removeprefix('next: ')}", detail=exc.detail)
    return error
