"""Every input set's arrays for one comparison: what the source graph says (hints, roles, genai_config, random
ops), the seeded sets, the edge sets, or the user's samples (inputsets.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from ortcompile.readback.feeds import Arrays, Feeds, InputSpec, make_feeds
from ortcompile.readback.given import Given, sample_count, sample_names
from ortcompile.readback.hints import read_hints
from ortcompile.readback.inputsets import InputSet, edge_sets, sample_sets, seed_sets
from ortcompile.readback.randomops import RandomOps, find_random_ops
from ortcompile.readback.roles import read_facts


@dataclass
class ChosenFeeds:
    arrays: list[Arrays]  # one per input set
    sets: list[InputSet]
    dims: dict[str, int] = field(default_factory=dict)
    guessed: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    unverifiable: str = ""  # random ops whose effect cannot be removed (randomops.py)


def set_feeds(source: Path, specs: Sequence[InputSpec], seeds: Sequence[int], dims: Mapping[str, int],
              given: Mapping[str, Given], edges: bool = True) -> ChosenFeeds:
    model = onnx.load(str(source), load_external_data=False)  # graph and small constants only: weights stay on disk
    hints, facts, randoms = read_hints(model), read_facts(model, source), find_random_ops(model)
    given = {name: g if isinstance(g, Given) else Given(g, "given") for name, g in given.items()}  # the Python API takes arrays
    given = {**given, **_silencers(randoms, specs, given)}
    count = sample_count(dict(given))

    def feeds_for(chosen: InputSet) -> Feeds:
        values = {n: g.sample(chosen.sample) for n, g in given.items()} if chosen.sample is not None else given
        return make_feeds(specs, seed=chosen.seed, dims=dims, given=values, hints=hints, facts=facts, edge=chosen.edge)

    sets = sample_sets(count, sample_names(dict(given))) if count > 1 else seed_sets(tuple(seeds) or (0,))
    first = feeds_for(sets[0])
    if count == 1 and edges and not _all_given(specs, given):
        sets += edge_sets({n: role for n, role in first.roles.items() if n not in given}, seed=sets[0].seed)
    made = [first, *(feeds_for(s) for s in sets[1:])]
    notes = [*first.notes, *randoms.notes()]
    for chosen, feeds in zip(sets[1:], made[1:]):
        if chosen.edge:
            notes += _grouped(chosen.name, [note for note in feeds.notes if note not in first.notes])
    if len(sets) > 1:
        notes.append("input sets: " + ", ".join(s.name for s in sets))
    return ChosenFeeds([f.arrays for f in made], sets, dict(first.dims), dict(first.guessed), notes, randoms.unverifiable())


def _grouped(set_name: str, notes: list[str]) -> list[str]:
    """One line per edge set and value: "padded ids: input_ids, token_type_ids: id 0 everywhere (padding)"."""
    by_text: dict[str, list[str]] = {}
    for note in notes:
        name, _, text = note.partition(": ")
        by_text.setdefault(text, []).append(name)
    return [f"{set_name}: {', '.join(names)}: {text}" for text, names in by_text.items()]


def _all_given(specs: Sequence[InputSpec], given: Mapping[str, Given]) -> bool:
    return all(spec.name in given for spec in specs)


def _silencers(randoms: RandomOps, specs: Sequence[InputSpec], given: Mapping[str, Given]) -> dict[str, Given]:
    """0 (false) for the inputs that scale random noise: the effect of the random ops removed on both sides."""
    names = {spec.name for spec in specs}
    return {name: Given(0, f"0 to remove random op {node}") for name, node in randoms.zeroed.items() if name in names}
