"""One home per composition axis (flakecheck/data/axes/): every declared axis's fields parse and serialise as a
composition's, explain's scheduling mechanisms are exactly the batch size plus the declared axes', the files
that replay, explain and reproduce name no axis's field, and an axis file dropped into the folder appears in
compositions, explain's replays, its fixes and repro without editing any other file."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

from flakecheck.analysis.attribution import LABELS, SCHEDULING
from flakecheck.data.axes import declared
from flakecheck.data.compositions import AXES, Composition, derive_name, load_compositions, parse_composition_spec
from flakecheck.explain.mechanisms import pairs
from flakecheck.explain.source import Divergence
from flakecheck.kernels.policy import parse_policy

PACKAGE = Path(__file__).resolve().parents[1] / "flakecheck"
# the files that once named each axis: they read the declarations now
READERS = ("replay/simulated.py", "replay/physical.py", "replay/shards.py", "replay/requests.py",
           "explain/mechanisms.py", "explain/fixes.py", "explain/costs.py", "explain/targeted.py",
           "explain/repro.py", "analysis/attribution.py")


def _with_examples(name: str = "x") -> Composition:
    return Composition(name, **{f.name: f.example for axis in AXES for f in axis.fields})


def test_the_moved_axes_are_declared_and_every_field_has_a_distinct_example() -> None:
    assert {"chunked_prefill", "prefix_cache", "tensor_parallel"} <= {a.name for a in AXES}
    assert AXES == declared()
    for axis in AXES:
        for f in axis.fields:
            assert f.example is not None and f.example != f.default, (axis.name, f.name)
            assert getattr(Composition("x"), f.name) == f.default
            assert f.check(f.example) is None


def test_every_axis_field_round_trips_through_spec_dict_and_file(tmp_path: Path) -> None:
    for axis in AXES:
        for f in axis.fields:
            one = Composition("x", **{f.name: f.example})
            assert parse_composition_spec(one.to_spec()) == one, f.name
            assert Composition.from_dict(json.loads(json.dumps(one.to_dict()))) == one, f.name
            # a spec without a name gets one that says the axis is set
            unnamed = parse_composition_spec(one.to_spec().removeprefix("name=x,"))
            assert unnamed.name == derive_name(one) != "solo"
            assert axis.name_part(one)
    every = _with_examples()
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(every.to_dict()) + "\n")
    assert load_compositions(path) == [every]
    assert parse_composition_spec(every.to_spec()) == every


def test_explain_mechanisms_are_the_batch_size_and_every_declared_axis() -> None:
    assert {m for m, _ in SCHEDULING} == {"batch_size"} | {a.name for a in AXES}
    assert all(LABELS[a.name] == a.label for a in AXES)
    policy = parse_policy("splitk")
    reference = Composition("solo")
    divergent = replace(_with_examples("every"), max_batch=4)
    got = pairs(Divergence("c", 3, divergent, 1, 5, 6, False), reference, policy)
    scheduling = [p for p in got if p.kind == "scheduling"]
    assert [p.mechanism for p in scheduling] == [m for m, _ in SCHEDULING]
    assert all(p.candidate for p in scheduling)
    for axis in AXES:
        pair = next(p for p in scheduling if p.mechanism == axis.name)
        assert pair.a is not None and pair.b is not None
        # the pair differs in this axis's fields and in no other axis's
        for other in AXES:
            differs = any(getattr(pair.a.composition, f.name) != getattr(pair.b.composition, f.name)
                          for f in other.fields)
            assert differs == (other is axis), (axis.name, other.name)
    # a composition without any axis: every axis's mechanism is not a candidate, with the axis's reason
    plain = pairs(Divergence("c", 3, Composition("b4", max_batch=4), 0, 5, 6, False), reference, policy)
    for axis in AXES:
        pair = next(p for p in plain if p.mechanism == axis.name)
        assert not pair.candidate and pair.reason == axis.absent(Composition("b4", max_batch=4))


def test_the_files_that_replay_and_explain_name_no_axis_field() -> None:
    fields = "|".join(re.escape(f.name) for a in AXES for f in a.fields)
    named = re.compile(rf"\.({fields})\b|[\"']({fields})[\"']")
    for relative in READERS:
        lines = (PACKAGE / relative).read_text(encoding="utf-8").splitlines()
        text = "\n".join(line for line in lines if not line.startswith(("from ", "import ")))  # module paths
        assert not named.search(text), (relative, named.search(text))


TOY = '''
"""A toy axis: speculative decoding's draft length (for the test only)."""
from flakecheck.data.axes.base import Axis, AxisField, AxisFix, optional_integer, optional_integer_text, renamed

AXIS = Axis(
    name="speculation", label="speculative verification", rank=45,
    fields=(AxisField("draft_len", "int | None", None, optional_integer, optional_integer_text,
                      lambda v: None if v is None or v >= 1 else f"draft_len must be >= 1, got {v}", example=4),),
    name_part=lambda c: None if c.draft_len is None else f"d{c.draft_len}",
    engine=lambda c: {},
    present=lambda c, reference: c.draft_len is not None,
    absent=lambda c: f"{c.name} does not speculate",
    strip=lambda c, reference: {"draft_len": None},
    pair=lambda d, reference: (renamed(d, "nodraft", draft_len=None), d),
    couples_cases=lambda c: c.draft_len is not None,
    fixes=(AxisFix("no_speculation", "no speculative decoding", "no --speculative-config", "no --speculative-algorithm",
                   changes=lambda c, reference: {"draft_len": None}),),
    price=lambda pricer, compositions: {"no_speculation": (None, "not priced (a toy)")},
    probe_args=lambda c: ["--speculate"] if c.draft_len else [],
    repro_note=lambda c: "speculates\\n" if c.draft_len else "",
)
'''

PROGRAM = '''
import json, sys
from types import SimpleNamespace
import flakecheck.data.axes as axes
axes.__path__.append(sys.argv[1])
from flakecheck.data.compositions import Composition, parse_composition_spec
from flakecheck.analysis.attribution import SCHEDULING
from flakecheck.explain.fixes import fixes_for
from flakecheck.explain.mechanisms import pairs
from flakecheck.explain.repro import probe_command
from flakecheck.explain.source import Divergence
from flakecheck.kernels.policy import parse_policy

c = parse_composition_spec("max_batch=1,draft_len=4")
solo = Composition("solo")
d = Divergence("a", 2, c, 0, 1, 2, False)
pair = next(p for p in pairs(d, solo, parse_policy("splitk")) if p.mechanism == "speculation")
source = SimpleNamespace(work=[(solo, 0), (c, 0)], reference=solo, moe=False,
                         config=SimpleNamespace(max_tokens=8, engine=SimpleNamespace(dtype="float32")))
fix = next(f for f in fixes_for(source) if f.id == "no_speculation")
print(json.dumps({
    "name": c.name, "spec": c.to_spec(), "dict": c.to_dict(), "alone": c.cases_alone,
    "round_trip": Composition.from_dict(c.to_dict()) == c,
    "scheduling": [m for m, _ in SCHEDULING],
    "pair": [pair.a.composition.draft_len, pair.b.composition.draft_len, pair.candidate],
    "fixed": fix.apply(c, 0, parse_policy("splitk"), solo).composition.draft_len,
    "probe": probe_command(source, d),
}))
'''


def test_an_axis_file_dropped_into_the_folder_reaches_compositions_explain_and_repro(tmp_path: Path) -> None:
    """Adding an axis is one file: the toy axis's file, found beside the declared ones, is a composition field,
    an explain mechanism with its pair, a fix and a probe option, with no other file edited."""
    (tmp_path / "speculation.py").write_text(textwrap.dedent(TOY))
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(tmp_path)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["name"] == "d4" and "draft_len=4" in got["spec"] and got["dict"]["draft_len"] == 4
    assert got["round_trip"] and got["alone"] is False  # it couples cases, as it declared
    assert "speculation" in got["scheduling"]
    assert got["pair"] == [None, 4, True]
    assert got["fixed"] is None
    assert "--speculate" in got["probe"]
    # and without the file, none of it is there
    assert "speculation" not in {m for m, _ in SCHEDULING}
