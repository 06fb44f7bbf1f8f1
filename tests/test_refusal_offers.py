"""A refusal's next steps name only options of the command the user ran.

`ortcompile llm` takes none of --inputs, --check, --cpu-nodes, --fallback, and `ortcompile stitch` only --check:
their refusals used to end in compile's steps (`--inputs DIR`, `--check load`), options the command would refuse.
Each command's offers (CompileOptions.refusal_offers, StitchJob.offers) are held against its click options here.
"""

from __future__ import annotations

import click
import pytest

from ortcompile.cli import main
from ortcompile.compile.stitch import StitchJob
from ortcompile.llm.package import LlmOptions, _compile_options
from ortcompile.options import ALL_REFUSAL_OFFERS, CompileOptions
from ortcompile.readback.nextsteps import next_steps

FLAG_OF_OFFER = {"cpu_nodes": "--cpu-nodes", "fallback": "--fallback", "inputs": "--inputs", "check": "--check"}


def _flags(command_name: str) -> set[str]:
    command = main.commands[command_name]
    assert isinstance(command, click.Command)
    return {flag for param in command.params for flag in param.opts}


def test_every_offer_names_a_flag() -> None:
    assert set(ALL_REFUSAL_OFFERS) == set(FLAG_OF_OFFER)


@pytest.mark.parametrize("options", [CompileOptions(), CompileOptions(partition=1 << 20), CompileOptions(share_weights=True)],
                         ids=["whole", "partition", "share-weights"])
def test_compile_offers_only_what_compile_takes(options: CompileOptions) -> None:
    offers = options.refusal_offers()
    assert {"inputs", "check"} <= set(offers)
    assert {FLAG_OF_OFFER[o] for o in offers} <= _flags("compile")


def test_llm_graphs_offer_nothing_llm_does_not_take() -> None:
    offers = _compile_options(LlmOptions(), {}, {"check": "run"}).refusal_offers()
    assert {FLAG_OF_OFFER[o] for o in offers} <= _flags("llm")
    assert next_steps("check", offers=offers) == "next: -v for the table of every output and input set"


def test_stitch_offers_check_only() -> None:
    offers = StitchJob.__dataclass_fields__["offers"].default
    assert {FLAG_OF_OFFER[o] for o in offers} <= _flags("stitch") and "--check" in {FLAG_OF_OFFER[o] for o in offers}
    text = next_steps("check", offers=offers)
    assert "--check load to publish" in text and "--inputs" not in text and "--cpu-nodes" not in text
