"""Compositions: specs and files parse or fail clearly; order and fillers are seeded, bounded and safe."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flakecheck.data.compositions import (
    DEFAULT_COMPOSITIONS,
    REFERENCE,
    Composition,
    Fillers,
    arrival_order,
    load_compositions,
    make_fillers,
    parse_composition_spec,
    resolve_compositions,
)
from flakecheck.errors import InputError, UserError


def test_default_set_is_the_designed_one() -> None:
    by_name = {c.name: c for c in DEFAULT_COMPOSITIONS}
    assert list(by_name) == ["solo", "batch8", "batch32", "chunked", "prefix", "load"]
    assert by_name["solo"].max_batch == 1 and by_name["solo"].order_seed is None
    assert by_name["batch32"].max_batch == 32 and by_name["batch32"].order_seed is not None
    assert (by_name["chunked"].max_batch, by_name["chunked"].chunk) == (16, 32)
    assert by_name["prefix"].prefix_cache
    assert by_name["load"].max_batch == 32 and by_name["load"].fillers.count > 0
    assert by_name["load"].arrival == "staggered"


def test_full_spec_sets_every_field() -> None:
    c = parse_composition_spec("name=b4,max_batch=4,chunk=16,prefix_cache=true,fillers=8,"
                               "filler_prompt_len=10-20,filler_output_len=5-6,order_seed=3,arrival=staggered")
    assert (c.name, c.max_batch, c.chunk, c.prefix_cache, c.order_seed, c.arrival) == (
        "b4", 4, 16, True, 3, "staggered")
    assert c.fillers == Fillers(count=8, prompt_len=(10, 20), output_len=(5, 6))


@pytest.mark.parametrize(("spec", "name"), [
    ("max_batch=4,chunk=16", "b4-c16"),
    ("max_batch=1", "solo"),
    ("prefix_cache=true", "p"),
    ("max_batch=32,fillers=4,arrival=staggered", "b32-f4-stag"),
])
def test_missing_names_are_derived(spec: str, name: str) -> None:
    assert parse_composition_spec(spec).name == name


@pytest.mark.parametrize(("spec", "words"), [
    ("colour=red", "unknown key 'colour'"),
    ("max_batch=four", "max_batch"),
    ("max_batch=0", "max_batch"),
    ("chunk=-3", "chunk"),
    ("prefix_cache=perhaps", "prefix_cache"),
    ("arrival=later", "arrival"),
    ("fillers=-1", "fillers"),
    ("filler_prompt_len=64-16", "filler_prompt_len"),
    ("filler_output_len=0-4", "filler_output_len"),
    ("max_batch", "key=value"),
    ("max_batch=2,max_batch=3", "twice"),
    ("name=has space", "name"),
    ("", "empty"),
])
def test_bad_specs_are_user_errors_naming_the_problem(spec: str, words: str) -> None:
    with pytest.raises(UserError) as info:
        parse_composition_spec(spec)
    assert words in str(info.value)


compositions = st.builds(
    Composition,
    name=st.from_regex(r"[a-z][a-z0-9_-]{0,10}", fullmatch=True),
    max_batch=st.integers(1, 64),
    order_seed=st.none() | st.integers(0, 1000),
    chunk=st.none() | st.integers(1, 512),
    prefix_cache=st.booleans(),
    fillers=st.builds(Fillers, count=st.integers(0, 32),
                      prompt_len=st.tuples(st.integers(1, 8), st.integers(8, 64)),
                      output_len=st.tuples(st.integers(1, 4), st.integers(4, 32)), seed=st.integers(0, 99)),
    arrival=st.sampled_from(["together", "staggered"]),
)


@given(compositions)
def test_to_dict_is_json_and_from_dict_inverts_it(composition: Composition) -> None:
    assert Composition.from_dict(json.loads(json.dumps(composition.to_dict()))) == composition


@given(compositions)
def test_a_spec_written_from_the_fields_parses_back(composition: Composition) -> None:
    f = composition.fillers
    spec = (f"name={composition.name},max_batch={composition.max_batch},order_seed={composition.order_seed},"
            f"chunk={composition.chunk},prefix_cache={composition.prefix_cache},fillers={f.count},"
            f"filler_prompt_len={f.prompt_len[0]}-{f.prompt_len[1]},"
            f"filler_output_len={f.output_len[0]}-{f.output_len[1]},filler_seed={f.seed},"
            f"arrival={composition.arrival}")
    assert parse_composition_spec(spec) == composition


# ---------------------------------------------------------------------------------------- files, resolve


def test_jsonl_and_json_files(tmp_path: Path) -> None:
    rows = [{"name": "x", "max_batch": 2}, {"max_batch": 4, "chunk": 16, "fillers": {"count": 2, "seed": 5}}]
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text("# comment\n" + "\n".join(json.dumps(r) for r in rows) + "\n")
    as_json = tmp_path / "c.json"
    as_json.write_text(json.dumps(rows, indent=2))
    for path in (jsonl, as_json):
        loaded = load_compositions(path)
        assert [c.name for c in loaded] == ["x", "b4-c16-f2-fs5"]
        assert loaded[1].fillers.count == 2 and loaded[1].fillers.seed == 5


@pytest.mark.parametrize(("line", "field"), [
    ('{"max_batch": "big"}', "max_batch"),
    ('{"colour": 1}', "colour"),
    ('{"fillers": {"count": 1, "speed": 2}}', "fillers.speed"),
    ('{"max_batch": 2', None),
    ("[1]", None),
])
def test_bad_composition_file_names_file_line_and_field(tmp_path: Path, line: str, field: str | None) -> None:
    path = tmp_path / "comps.jsonl"
    path.write_text('{"name": "ok"}\n\n' + line + "\n")
    with pytest.raises(InputError) as info:
        load_compositions(path)
    assert (info.value.line, info.value.field) == (3, field)
    assert "comps.jsonl:3" in str(info.value)


def test_bad_entry_in_a_json_list_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "comps.json"
    path.write_text('[\n  {"name": "ok"},\n  {"max_batch": 0}\n]\n')
    with pytest.raises(InputError) as info:
        load_compositions(path)
    assert info.value.line == 3 and info.value.field == "max_batch"


def test_empty_or_missing_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(InputError, match="no compositions"):
        load_compositions(empty)
    with pytest.raises(InputError, match="not found"):
        load_compositions(tmp_path / "missing.json")


def test_resolve_defaults_and_reference_first(tmp_path: Path) -> None:
    assert resolve_compositions(None, []) == list(DEFAULT_COMPOSITIONS)
    resolved = resolve_compositions(None, ["max_batch=8", "name=solo", "chunk=4"])
    assert [c.name for c in resolved] == [REFERENCE, "b8", "c4"]
    assert [c.name for c in resolve_compositions(None, ["max_batch=8", "chunk=4"])] == ["b8", "c4"]


def test_file_and_specs_combine(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text('{"name": "from-file", "max_batch": 3}\n')
    assert [c.name for c in resolve_compositions(path, ["max_batch=2"])] == ["from-file", "b2"]


def test_duplicate_names_are_rejected() -> None:
    with pytest.raises(UserError, match="'b4'"):
        resolve_compositions(None, ["max_batch=4", "name=b4,chunk=8"])


# ----------------------------------------------------------------------------------- order and fillers


@given(n=st.integers(0, 60), seed=st.none() | st.integers(0, 100), repeat=st.integers(0, 5))
def test_arrival_order_is_a_deterministic_permutation(n: int, seed: int | None, repeat: int) -> None:
    composition = Composition("c", order_seed=seed)
    order = arrival_order(n, composition, repeat)
    assert sorted(order) == list(range(n))
    assert arrival_order(n, composition, repeat) == order


def test_arrival_order_keeps_suite_order_only_when_unshuffled_and_first_repeat() -> None:
    n = 30
    assert arrival_order(n, Composition("c"), 0) == list(range(n))
    assert arrival_order(n, Composition("c", order_seed=1), 0) != list(range(n))
    orders = {tuple(arrival_order(n, Composition("c", order_seed=1), r)) for r in range(4)}
    assert len(orders) == 4  # each repeat is another order
    assert arrival_order(n, Composition("c", order_seed=1), 0) != arrival_order(n, Composition("c", order_seed=2), 0)


SPECIAL = {0, 1, 2, 5, 7}


def filler_comp(arrival: str = "together", seed: int = 0, count: int = 12) -> Composition:
    return Composition("f", max_batch=4, fillers=Fillers(count=count, prompt_len=(3, 9), output_len=(2, 6),
                                                         seed=seed), arrival=arrival)


@given(seed=st.integers(0, 1000), repeat=st.integers(0, 3), vocab=st.integers(9, 500))
def test_fillers_are_seeded_bounded_and_avoid_special_ids(seed: int, repeat: int, vocab: int) -> None:
    composition = filler_comp(seed=seed)
    fillers = make_fillers(composition, vocab, SPECIAL, repeat, n_cases=10)
    assert fillers == make_fillers(composition, vocab, SPECIAL, repeat, n_cases=10)
    assert len(fillers) == composition.fillers.count
    for filler in fillers:
        assert 3 <= len(filler.prompt_ids) <= 9 and 2 <= filler.max_tokens <= 6
        assert all(0 <= t < vocab and t not in SPECIAL for t in filler.prompt_ids)
        assert filler.arrival == 0


def test_fillers_differ_across_seeds_and_repeats() -> None:
    base = make_fillers(filler_comp(seed=1), 1000, SPECIAL, 0, 10)
    assert base != make_fillers(filler_comp(seed=2), 1000, SPECIAL, 0, 10)
    assert base != make_fillers(filler_comp(seed=1), 1000, SPECIAL, 1, 10)


def test_staggered_fillers_arrive_during_decode_in_order() -> None:
    fillers = make_fillers(filler_comp("staggered"), 1000, SPECIAL, 0, n_cases=10)
    arrivals = [f.arrival for f in fillers]
    assert arrivals == sorted(arrivals) and arrivals[0] >= 1 and len(set(arrivals)) > 1
    # Spread over the suite's decode span: ceil(10 / 4) waves of at most 6 tokens each.
    assert arrivals[-1] <= 3 * 6


def test_no_fillers_and_no_usable_ids() -> None:
    assert make_fillers(Composition("c"), 100, SPECIAL, 0, 10) == []
    with pytest.raises(ValueError):
        make_fillers(filler_comp(), 3, {0, 1, 2}, 0, 10)
