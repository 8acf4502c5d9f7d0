"""`flakecheck explain` and `flakecheck repro` on the tiny wide model.

The attribution is checked against independent replays: every mechanism pair's first divergence must be what
physical replays (one composition at a time, no lockstep, no reuse of recorded traces, no early stop) of the
same two variants give within the same window. The fix list is checked the same way for one fix, and the
repro script is run in a fresh process."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import flakecheck
from flakecheck.analysis.attribution import LABELS
from flakecheck.analysis.divergence import first_divergence
from flakecheck.data.compositions import Composition, Fillers
from flakecheck.data.rundir import RunData
from flakecheck.engine import LoadedModel, build_model, load_model
from flakecheck.errors import UserError
from flakecheck.explain.mechanisms import pairs
from flakecheck.explain.repro import needed_cases, write_repro
from flakecheck.explain.source import open_run, with_requests
from flakecheck.kernels import get_ops
from flakecheck.kernels.policy import parse_policy
from flakecheck.replay.simulated import Job, Simulation
from tests.test_run import cli_run
from tests.test_simulation import write_suite

# every mechanism has a candidate somewhere: a batch, chunked prefill in a batch, a serial prefix cache, fillers
COMPOSITIONS = [Composition("solo"), Composition("b4", max_batch=4),
                Composition("chunked", max_batch=4, chunk=16), Composition("prefix", prefix_cache=True),
                Composition("load", max_batch=6, fillers=Fillers(count=4, prompt_len=(3, 30)), arrival="staggered")]
ONE_CLASS = ("matmul=splitk,attention=invariant,norm=invariant", "matmul=invariant,attention=splitk,norm=invariant",
             "matmul=invariant,attention=invariant,norm=splitk")


@pytest.fixture(scope="module")
def wide(tiny_wide_model_dir: Path) -> LoadedModel:
    return load_model(str(tiny_wide_model_dir), "bfloat16")


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_suite(tmp_path_factory.mktemp("explain") / "explain.jsonl")


def run(model: LoadedModel, suite: Path, out: Path, kernels: str, compositions=COMPOSITIONS, **options) -> RunData:
    return flakecheck.run_suite(suite, model=model, kernels=kernels, compositions=compositions, out=out,
                                html=False, **options)


@pytest.fixture(scope="module")
def splitk(wide, suite, tmp_path_factory) -> RunData:
    return run(wide, suite, tmp_path_factory.mktemp("runs") / "splitk", "splitk")


@pytest.fixture(scope="module")
def explained(wide, splitk) -> RunData:
    return flakecheck.explain_run(splitk.path, model=wide, steps_after=2, cost_repeats=1)


def diverged(run: RunData) -> list[str]:
    return sorted(run.cases[run.cases.status.isin(["flaky", "verdict_flaky"])].case_id)


def test_every_diverged_case_gets_a_row_per_mechanism_and_a_verdict(splitk, explained) -> None:
    cases = diverged(splitk)
    assert cases, "the split-K run must diverge somewhere for this test to mean anything"
    rows = explained.attribution
    assert sorted(set(rows.case_id)) == cases and len(rows) == 7 * len(cases)
    for case_id, summary in explained.explain["cases"].items():
        mine = rows[rows.case_id == case_id]
        reproducing = set(mine[mine.reproduces].mechanism)
        assert set(summary["mechanisms"]) == reproducing
        named = " + ".join(LABELS[m] for m in mine[mine.reproduces].mechanism)
        assert summary["summary"] == (named or "interaction")
        # a mechanism is a candidate exactly where it varies: every reduction (full split-K), a scheduling
        # feature only where the divergent composition has it
        where = splitk.cases.set_index("case_id").loc[case_id, "divergence_composition"]
        composition = next(c for c in COMPOSITIONS if c.name == where)
        candidate = dict(zip(mine.mechanism, mine.candidate))
        assert candidate["matmul_splitk"] and candidate["attention_splitkv"] and candidate["norm_splits"]
        assert candidate["chunked_prefill"] == (composition.chunk is not None)
        assert candidate["prefix_cache"] == composition.prefix_cache
        assert candidate["batch_size"] == (composition.max_batch > 1)
        assert not candidate["tensor_parallel"]  # every composition here runs at one rank
        # reproducing means diverging at the recorded step
        step = splitk.cases.set_index("case_id").loc[case_id, "first_divergence"]
        assert (mine[mine.reproduces].first_divergence == step).all()


def test_attribution_matches_independent_physical_replays(wide, suite, splitk, explained, tmp_path) -> None:
    """Each pair's first divergence (within the window) equals that of physical replays of the two variants."""
    source = open_run(splitk.path)
    variants = {}  # policy spec -> compositions to replay under it
    pair_of = {}
    for d in source.divergences():
        for pair in pairs(d, source.reference, source.policy):
            if pair.a is not None and pair.b is not None:
                pair_of[(d.case_id, pair.mechanism)] = pair
                for v in (pair.a, pair.b):
                    variants.setdefault(v.policy.name, {})[v.composition.name] = v.composition
    tokens = {}
    for spec, by_name in variants.items():
        replayed = run(wide, suite, tmp_path / spec.replace(",", "_").replace("=", "-"), spec,
                       compositions=list(by_name.values()), replay="physical")
        for row in replayed.runs.itertuples():
            tokens[(spec, row.composition, row.case_id)] = [int(t) for t in row.token_ids]
    checked = 0
    for row in explained.attribution[explained.attribution.candidate].itertuples():
        pair = pair_of[(row.case_id, row.mechanism)]
        a = tokens[(pair.a.policy.name, pair.a.composition.name, row.case_id)][:row.window]
        b = tokens[(pair.b.policy.name, pair.b.composition.name, row.case_id)][:row.window]
        expected = first_divergence(a, b)
        got = None if math.isnan(row.first_divergence) else int(row.first_divergence)
        assert got == expected, (row.case_id, row.mechanism)
        checked += 1
    assert checked and explained.attribution.reproduces.any()


def test_split_k_matmuls_alone_are_attributed_to_matmuls(wide, suite, tmp_path) -> None:
    """Under matmul=splitk with fixed-order attention and norms, matmuls are the only reduction that can flip a
    case: every diverged case is attributed to them, and the other reductions are not candidates."""
    mixed = run(wide, suite, tmp_path / "mixed", "matmul=splitk,attention=invariant,norm=invariant")
    assert mixed.meta["engine"]["op_classes"] == {"matmul": "splitk", "attention": "invariant", "norm": "invariant"}
    cases = diverged(mixed)
    assert cases
    explained = flakecheck.explain_run(mixed.path, model=wide, steps_after=1, fixes=False)
    rows = explained.attribution
    for case_id in cases:
        mine = rows[rows.case_id == case_id].set_index("mechanism")
        assert mine.loc["matmul_splitk", "reproduces"]
        for other in ("attention_splitkv", "norm_splits"):
            assert not mine.loc[other, "candidate"] and "invariant" in mine.loc[other, "reason"]
        assert explained.explain["cases"][case_id]["reduction"] == "matmul split-K"
    assert explained.fixes is None


def test_invariant_everywhere_attributes_nothing(wide, suite, tmp_path, monkeypatch, capsys) -> None:
    invariant = run(wide, suite, tmp_path / "inv", "invariant")
    assert not diverged(invariant)
    code, out, _ = cli_run(monkeypatch, capsys, "explain", str(invariant.path))
    assert code == 0 and "no diverged case to explain" in out
    again = flakecheck.load_run(invariant.path)
    assert again.attribution is not None and again.attribution.empty and again.fixes is None


def test_damaged_explain_tables_are_an_error_that_explain_itself_repairs(wide, suite, tmp_path, monkeypatch,
                                                                         capsys) -> None:
    """A run directory whose explain tables were damaged (a partial artifact copy) names the remedy, and the
    remedy works: explain reopens the run without them and writes them again."""
    invariant = run(wide, suite, tmp_path / "inv", "invariant")
    assert cli_run(monkeypatch, capsys, "explain", str(invariant.path))[0] == 0
    (invariant.path / "attribution.parquet").write_bytes(b"not parquet")
    with pytest.raises(UserError, match="run `flakecheck explain"):
        flakecheck.load_run(invariant.path)
    code, out, _ = cli_run(monkeypatch, capsys, "explain", str(invariant.path))
    assert code == 0 and "no diverged case to explain" in out
    assert flakecheck.load_run(invariant.path).attribution is not None


def test_an_early_stop_gives_the_first_tokens_of_the_full_replay(wide, splitk) -> None:
    """Windows stop a batched core once its cases of interest have their tokens; the batch-mates keep their
    full token limits until then, so every case's tokens are the recorded full replay's first tokens."""
    source = with_requests(open_run(splitk.path), wide)
    network = build_model(wide, get_ops(parse_policy("splitk"), "torch", "h100"))
    for composition in COMPOSITIONS[1:]:
        recorded = source.recorded[(composition.name, 0)]
        interest = sorted(recorded)[::3]
        windows = {case_id: 2 + i % 3 for i, case_id in enumerate(interest)}
        job = Job(composition, 0, label="early", cases=frozenset(interest))
        simulation = Simulation(wide, network, source.requests, [job], lambda t: None, lambda r: None,
                                windows=windows)
        simulation.lockstep.run()
        for case_id, window in windows.items():
            trace = simulation.trace(job, case_id)
            assert trace is not None and len(trace.token_ids) >= min(window, len(recorded[case_id]))
            assert trace.token_ids == recorded[case_id][:len(trace.token_ids)], (composition.name, case_id)
        whole = Simulation(wide, network, source.requests, [job], lambda t: None, lambda r: None)
        whole.lockstep.run()
        assert [whole.trace(job, c).token_ids for c in interest] == [recorded[c] for c in interest]
        assert simulation.lockstep.stats.rows < whole.lockstep.stats.rows  # it did stop early


def test_fix_list(splitk, explained) -> None:
    fixes = explained.fixes.set_index("fix")
    n = len(diverged(splitk))
    assert sorted(explained.fixes["rank"]) == list(range(1, 7))
    assert (fixes.flaky_cases == n).all() and fixes.stabilised.between(0, n).all()
    assert fixes.loc["fixed_all", "full_fix"] and fixes.loc["fixed_all", "stabilised"] == n
    assert fixes.loc["fixed_all", "verdict_flips_after"] == 0
    ranked = explained.fixes.sort_values("rank")
    full = list(ranked.full_fix)
    assert full == sorted(full, reverse=True)  # every full fix ranks above every partial one
    for fix in ranked.itertuples():
        assert fix.cost and fix.vllm and fix.sglang
        if len(fix.changes):
            assert fix.cost_factor > 0
    assert fixes.loc["fixed_all", "vllm"] == "VLLM_BATCH_INVARIANT=1"
    assert fixes.loc["no_prefix_cache", "sglang"] == "--disable-radix-cache"


def test_serial_fix_matches_an_independent_replay(wide, suite, splitk, explained, tmp_path) -> None:
    serial = [Composition(c.name, chunk=c.chunk, prefix_cache=c.prefix_cache) for c in COMPOSITIONS]
    replayed = run(wide, suite, tmp_path / "serial", "splitk", compositions=serial, replay="physical")
    stable = [c for c in diverged(splitk)
              if replayed.runs[replayed.runs.case_id == c].token_ids.map(tuple).nunique() == 1]
    row = explained.fixes.set_index("fix").loc["serial"]
    assert row.stabilised == len(stable)
    assert sorted(row.still_flaky) == sorted(set(diverged(splitk)) - set(stable))


def test_reports_show_the_explanation(explained, splitk, tmp_path) -> None:
    from flakecheck.reports.html import render_html
    from flakecheck.reports.json_report import report_dict
    from flakecheck.reports.markdown import render_markdown

    data = report_dict(explained)["explain"]
    assert {c["case_id"] for c in data["cases"]} == set(diverged(splitk))
    assert [f["rank"] for f in data["fixes"]] == list(range(1, 7))
    assert "### Why they flipped" in render_markdown(explained) and "Smallest fix" in render_markdown(explained)
    html = render_html(explained)
    assert 'id="attribution"' in html and 'id="fixes"' in html
    # a copy without explain.json renders as before
    old = tmp_path / "old"
    shutil.copytree(explained.path, old)
    (old / "explain.json").unlink()
    plain = flakecheck.load_run(old)
    assert plain.attribution is None and report_dict(plain)["explain"] is None
    assert "Why they flipped" not in render_markdown(plain) and 'id="attribution"' not in render_html(plain)


def test_a_repro_script_reproduces_its_case(splitk, tmp_path) -> None:
    batched = splitk.cases[splitk.cases.divergence_composition.isin(["b4", "chunked", "load"])]
    assert len(batched)
    case_id = str(batched.case_id.iloc[0])
    path = write_repro(splitk.path, case_id, tmp_path / "repro")
    assert {p.name for p in path.iterdir()} == {"suite.jsonl", "compositions.jsonl", "repro.py", "expected.json",
                                               "README.txt"}
    assert len((path / "suite.jsonl").read_text().splitlines()) == len(splitk.cases)  # batch-mates included
    assert "flakecheck probe suite.jsonl" in (path / "README.txt").read_text()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run([sys.executable, str(path / "repro.py")], cwd=elsewhere, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"reproduced: {case_id}" in done.stdout
    # the check can fail: a wrong recorded step is not reproduced
    expected = json.loads((path / "expected.json").read_text())
    (path / "expected.json").write_text(json.dumps({**expected, "step": expected["step"] + 1}))
    wrong = subprocess.run([sys.executable, str(path / "repro.py")], cwd=elsewhere, capture_output=True, text=True,
                           timeout=600)
    assert wrong.returncode == 1 and "NOT reproduced" in wrong.stdout


def test_a_repro_carries_the_suite_lines_its_composition_needs() -> None:
    ids = ["a", "b", "c"]
    assert needed_cases(Composition("serial-chunk", chunk=7), "b", ids) == ["b"]  # alone in every step
    assert needed_cases(Composition("prefix", prefix_cache=True), "b", ids) == ids  # earlier prompts fill the cache
    assert needed_cases(Composition("b4", max_batch=4), "b", ids) == ids  # batch-mates
    assert needed_cases(Composition("serial-f", fillers=Fillers(count=3)), "c", ids) == ["c"]


@pytest.mark.parametrize("spec, message", [
    ("matmul=splitk,attention=bogus", "unknown order"), ("matmul=splitk,matmul=invariant", "given twice"),
    ("softmax=splitk", "unknown op class"), ("fast", "unknown kernel policy"), ("matmul", "unknown kernel policy"),
])
def test_bad_kernel_specs_exit_2(suite, monkeypatch, capsys, spec, message) -> None:
    code, _, err = cli_run(monkeypatch, capsys, "run", str(suite), "--kernels", spec, "--out", "/nonexistent/x")
    assert code == 2 and "--kernels" in err and message in err


def test_mixed_kernel_flags_parse(monkeypatch) -> None:
    from tests.test_config import parsed_by_the_cli

    config = parsed_by_the_cli(["flakecheck", "run", "s.jsonl", "--kernels", "attention=splitk, matmul=splitk"],
                               monkeypatch)
    policy = config.policy
    assert (policy.matmul, policy.attention, policy.norm) == ("splitk", "splitk", "invariant")


def test_bad_run_directories_exit_2(splitk, suite, tmp_path, monkeypatch, capsys) -> None:
    assert cli_run(monkeypatch, capsys, "explain", str(tmp_path / "missing"))[0] == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = cli_run(monkeypatch, capsys, "explain", str(empty))
    assert code == 2 and "not a complete run directory" in err
    probe = tmp_path / "probe"
    shutil.copytree(splitk.path, probe)
    meta = json.loads((probe / "meta.json").read_text())
    (probe / "meta.json").write_text(json.dumps({**meta, "source": "probe", "config": None}))
    code, _, err = cli_run(monkeypatch, capsys, "explain", str(probe))
    assert code == 2 and "engine" in err
    changed = tmp_path / "changed.jsonl"
    changed.write_text(suite.read_text() + '{"id": "extra", "prompt": "x"}\n')
    code, _, err = cli_run(monkeypatch, capsys, "explain", str(splitk.path), "--suite", str(changed))
    assert code == 2 and "sha256" in err
    code, _, err = cli_run(monkeypatch, capsys, "explain", str(splitk.path), "--ids", "nope")
    assert code == 2 and "nope" in err
    code, _, err = cli_run(monkeypatch, capsys, "explain", str(splitk.path), "--steps-after", "-1")
    assert code == 2 and "--steps-after" in err
    stable = str(splitk.cases[~splitk.cases.status.isin(["flaky", "verdict_flaky"])].case_id.iloc[0])
    code, _, err = cli_run(monkeypatch, capsys, "repro", str(splitk.path), stable, "--out", str(tmp_path / "r1"))
    assert code == 2 and "did not diverge" in err and not (tmp_path / "r1").exists()
    code, _, err = cli_run(monkeypatch, capsys, "repro", str(splitk.path), "no-such-case")
    assert code == 2 and "not a case" in err
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "x").write_text("mine")
    code, _, err = cli_run(monkeypatch, capsys, "repro", str(splitk.path), diverged(splitk)[0], "--out", str(taken))
    assert code == 2 and "not empty" in err and (taken / "x").read_text() == "mine"
