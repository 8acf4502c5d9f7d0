"""Run directories built directly from constructed traces (no model): grading, analysis, the three parquet
tables and meta.json through flakecheck.run.pipeline.finish_run, the writer `flakecheck run` ends with. Fast enough
for hypothesis.

`run_specs()` draws suites with outputs of 0, 1 and many tokens, empty texts, all-stable, all-flaky and mixed
suites, cases with and without checks, and ids and token texts with non-ASCII, markup and `<script>` in them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from flakecheck.analysis.divergence import Thresholds
from flakecheck.data.record import Computer
from flakecheck.data.rundir import RunData, RunDirectory
from flakecheck.data.suite import Case, Suite
from flakecheck.data.traces import Trace
from flakecheck.grading.checks import parse_check
from flakecheck.run import pipeline

SCRIPT = "<script>alert(1)</script>"
# Token texts: the empty string (an end-of-turn token decodes to nothing), whitespace, non-ASCII, markup that
# HTML, markdown and XML must escape, and a control character XML 1.0 cannot carry.
VOCAB = ["", " ", "\n", "a", " the", "é", "日本", "🙂", SCRIPT, "&amp;", "`|*_", "]]>", "\x0b", "42", " Paris"]
ID_ALPHABET = st.sampled_from(list("abcxyz019-_ .é日<>&\"'/") + [SCRIPT])


@dataclass
class CaseSpec:
    case_id: str
    check: str | None  # a token text the output must contain, or None: no checks, no target
    outputs: list[list[int]]  # token ids per composition, the reference first
    gaps: list[float]  # the reference's top-1/top-2 gap per step (other compositions reuse them, cut)


@dataclass
class RunSpec:
    compositions: list[str]
    cases: list[CaseSpec]
    dtype: str = "bfloat16"
    gap_threshold: float = 0.05
    meta_extra: dict[str, Any] = field(default_factory=dict)
    draws: list[str] = field(default_factory=list)  # compositions that are draws from a load (flip probability)


def decode(ids: list[int]) -> str:
    return "".join(VOCAB[i] for i in ids)


def token_text(token_id: int) -> str:
    return VOCAB[token_id]


def trace(case_id: str, composition: str, ids: list[int], gaps: list[float]) -> Trace:
    steps = len(ids)
    gaps = (gaps + [1.0] * steps)[:steps]
    top1 = [-0.25 * (1 + i % 3) for i in range(steps)]
    return Trace(case_id, composition, 0, list(ids), list(ids), top1,
                 [(t + 1) % len(VOCAB) for t in ids], [a - g for a, g in zip(top1, gaps)],
                 "stop" if ids and ids[-1] == 0 else "length")


def suite_case(spec: CaseSpec, line: int) -> Case:
    checks = () if spec.check is None else (parse_check({"type": "contains", "value": spec.check}, "s", line,
                                                        "checks[0]"),)
    return Case(spec.case_id, f"Question {line}: {spec.case_id} {SCRIPT}", (), checks, None,
                {"kind": "k<b>" if line % 2 else "é"}, line)


def write_run(path: Path, spec: RunSpec, traces: list[Trace] | None = None) -> RunData:
    """The run directory `flakecheck run` would write for these traces (`traces`: instead of the spec's
    outputs), through the same writer."""
    cases = [suite_case(c, i + 1) for i, c in enumerate(spec.cases)]
    if traces is None:
        traces = [trace(c.case_id, comp, ids, c.gaps)
                  for c in spec.cases for comp, ids in zip(spec.compositions, c.outputs)]
    source = pipeline.SourceRecord(
        "engine", "constructed", spec.dtype, Computer("splitk", "torch", "h100", op_orders=("splitk",) * 3),
        [{"name": n} for n in spec.compositions], "flakecheck run built.jsonl",
        details={"repeat": 1, **spec.meta_extra})
    return pipeline.finish_run(RunDirectory(path), Suite(Path("built.jsonl"), cases, "0" * 64), traces,
                               spec.compositions[0], Thresholds(gap_threshold=spec.gap_threshold),
                               pipeline.TokenTexts(decode, token_text), source, {}, draws=spec.draws)


# ------------------------------------------------------------------------------------------------ strategies

token_ids = st.integers(0, len(VOCAB) - 1)
gap_values = st.sampled_from([0.0, 0.0078125, 0.03125, 0.04, 0.2, 3.0])


@st.composite
def outputs_of(draw: st.DrawFn, n_compositions: int, mode: str) -> list[list[int]]:
    """The reference's tokens (0, 1 or many) and each other composition's: equal, or diverging at a step."""
    reference = draw(st.one_of(st.just([]), st.lists(token_ids, min_size=1, max_size=1),
                               st.lists(token_ids, min_size=2, max_size=8)))
    outputs = [reference]
    for k in range(1, n_compositions):
        diverge = mode == "flaky" and k == 1 or mode == "mixed" and draw(st.booleans())
        if not diverge:
            outputs.append(list(reference))
            continue
        step = draw(st.integers(0, len(reference)))
        other = reference[:step] + draw(st.lists(token_ids, min_size=0, max_size=4))
        if other == reference:  # make sure it differs: change or add the token at `step`
            other = reference[:step] + [(reference[step] + 1) % len(VOCAB) if step < len(reference) else 3]
        outputs.append(other)
    return outputs


@st.composite
def run_specs(draw: st.DrawFn, min_compositions: int = 1) -> RunSpec:
    mode = draw(st.sampled_from(["stable", "flaky", "mixed"]))
    compositions = ["solo", "batch8", "load"][: draw(st.integers(max(min_compositions, 2 if mode == "flaky" else 1),
                                                                 3))]
    ids = draw(st.lists(st.lists(ID_ALPHABET, min_size=1, max_size=4).map("".join).filter(lambda s: s.strip()),
                        min_size=1, max_size=6, unique=True))
    cases = []
    for case_id in ids:
        outputs = draw(outputs_of(len(compositions), mode))
        gaps = draw(st.lists(gap_values, min_size=len(outputs[0]), max_size=len(outputs[0])))
        check = draw(st.one_of(st.none(), st.sampled_from(VOCAB[3:])))
        cases.append(CaseSpec(case_id, check, outputs, gaps))
    # sometimes the other compositions are draws: reports then carry the flip-probability block too
    draws = compositions[1:] if draw(st.booleans()) else []
    return RunSpec(compositions, cases, dtype=draw(st.sampled_from(["bfloat16", "float16", "float32"])), draws=draws)
