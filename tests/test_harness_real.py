"""The eval harnesses themselves against `flakecheck serve --kernels splitk` (the tiny wide model on a loopback
port): inspect_ai at 1 and 16 connections with top-2 logprobs, lm-eval at num_concurrent 1 and 8, each over
eight short questions; then `flakecheck import` on their logs, and a replay of the imported suite.

Checked: the import flags a case flaky exactly when the two logs' answers differ; every reported first
divergence is where the logged tokens (lm-eval: texts) part; the verdicts recorded are the harness's own; the
imported suite's checks grade the replay as the harness graded the serial run; and the replay's solo
composition gives the serial run's answers (same engine, same requests). What the logs say is read through
inspect_ai's own reader (tests/fixtures/harness/inspect_oracle.py, in .venv-inspect) and lm-eval's JSON lines.

Needs .venv-inspect and .venv-lmeval (`make harness-setup`; `make test` makes them, so CI runs this);
skipped elsewhere without them."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from flakecheck.data.compositions import resolve_compositions
from flakecheck.data.rundir import load_run
from flakecheck.run.engine_source import run_suite
from tests.fixtures_serve import *  # noqa: F403
from tests.fixtures_serve import SERVED_NAME, start_server
from tests.harness_helpers import diverged, fixture, parting, reported, run_cli

ROOT = Path(__file__).resolve().parents[1]
INSPECT, INSPECT_PY = ROOT / ".venv-inspect/bin/inspect", ROOT / ".venv-inspect/bin/python"
LM_EVAL = ROOT / ".venv-lmeval/bin/lm_eval"
TIMEOUT_S = 300  # a bound for a stuck harness, not a speed goal

pytestmark = [
    pytest.mark.harness,
    pytest.mark.skipif(not (INSPECT.exists() and LM_EVAL.exists()),
                       reason="needs .venv-inspect and .venv-lmeval: make harness-setup"),
]

# Sixteen questions of 5 to 90-odd tokens (varied lengths make varied batch shapes, where split-K's reduction
# order changes). Targets that the tiny random model's answers contain in some cases and not in others, so
# both verdicts are likely (the fixtures in test_harness_import.py are where both verdicts surely occur).
TOPICS = ["the capital of France", "adding two numbers", "the sea at morning", "primes below twenty",
          "a haiku about wind", "London in winter", "rivers and stones", "the answer to a question"]
QUESTIONS = [(f"Tell me about {TOPICS[i % len(TOPICS)]}. " * (1 + i % 7), target)
             for i, target in enumerate(["\ufffd", "a", "gh", "e"] * 4)]
LMEVAL_TARGETS = ["[invalid]", "i", "a", "e"] * 4  # "[invalid]": the filter found no vowel
INSPECT_TASK = '''
from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.scorer import includes
from inspect_ai.solver import generate, system_message

QUESTIONS = {questions!r}


@task
def flk():
    return Task(dataset=[Sample(input=q, target=t, id=f"q{{i}}") for i, (q, t) in enumerate(QUESTIONS, 1)],
                solver=[system_message("Answer briefly."), generate()], scorer=includes())
'''

LMEVAL_TASK = """task: flk_tiny
dataset_path: json
dataset_kwargs:
  data_files:
    test: questions.jsonl
test_split: test
output_type: generate_until
doc_to_text: "{{question}}"
doc_to_target: "{{answer}}"
generation_kwargs:
  until: ["gh", "\\n\\n"]
  max_gen_toks: 16
  do_sample: false
  temperature: 0.0
filter_list:
  - name: first-vowel
    filter:
      - function: regex
        regex_pattern: "([aeiou])"
      - function: take_first
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""


def harness(command: list[str], cwd: Path, env: dict[str, str]) -> None:
    done = subprocess.run(command, cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def peak_batch(url: str) -> int:
    return int(httpx.get(f"{url}/stats").json()["peak_running_seqs"])


@pytest.fixture(scope="module")
def inspect_logs(serve_model, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict]]:
    """The serial (.eval) and the 16-connection (.json) log, each with what inspect_ai's reader sees in it."""
    work = tmp_path_factory.mktemp("inspect")
    task = work / "flk_task.py"
    task.write_text(INSPECT_TASK.format(questions=QUESTIONS))
    logs = {}
    with start_server(serve_model, kernels="splitk", max_num_seqs=16) as served:
        env = {"FLK_BASE_URL": f"{served.url}/v1", "FLK_API_KEY": "unused"}
        for connections, fmt in ((1, "eval"), (16, "json")):
            log_dir = work / f"c{connections}"
            harness([str(INSPECT), "eval", f"{task}@flk", "--model", f"openai-api/flk/{SERVED_NAME}",
                     "--max-connections", str(connections), "--max-tokens", "16", "--logprobs", "--top-logprobs",
                     "2", "--log-dir", str(log_dir), "--log-format", fmt, "--display", "none"], work, env)
            [log] = log_dir.glob(f"*.{fmt}")
            oracle_file = work / f"c{connections}.oracle.json"
            harness([str(INSPECT_PY), str(fixture("inspect_oracle.py")), str(log), str(oracle_file)], work, {})
            oracle = json.loads(oracle_file.read_text())
            assert oracle["status"] == "success"  # `inspect eval` exits 0 even when the eval failed
            logs[f"c{connections}"] = (log, {(s["id"], s["epoch"]): s for s in oracle["samples"]})
            # the server's own count: the serial run ran one sequence a step, the other really batched
            assert peak_batch(served.url) == 1 if connections == 1 else peak_batch(served.url) >= 8
    return logs


@pytest.fixture(scope="module")
def lmeval_samples(serve_model, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict]]:
    work = tmp_path_factory.mktemp("lmeval")
    (work / "flk_tiny.yaml").write_text(LMEVAL_TASK)
    (work / "questions.jsonl").write_text("".join(json.dumps({"question": q, "answer": t}) + "\n"
                                                  for (q, _), t in zip(QUESTIONS, LMEVAL_TARGETS)))
    env = {"OPENAI_API_KEY": "unused", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "HF_HOME": str(work / "hf"), "HF_DATASETS_CACHE": str(work / "hf")}
    files = {}
    with start_server(serve_model, kernels="splitk", max_num_seqs=16) as served:
        for concurrent in (1, 8):
            out = work / f"c{concurrent}"
            harness([str(LM_EVAL), "--model", "local-chat-completions", "--model_args",
                     f"model={SERVED_NAME},base_url={served.url}/v1/chat/completions,num_concurrent={concurrent},"
                     "tokenized_requests=False,max_retries=1", "--apply_chat_template", "--include_path", str(work),
                     "--tasks", "flk_tiny", "--log_samples", "--output_path", str(out)], work, env)
            assert peak_batch(served.url) == 1 if concurrent == 1 else peak_batch(served.url) >= 4
            [samples] = out.glob("*/samples_flk_tiny_*.jsonl")
            lines = [json.loads(line) for line in samples.read_text().splitlines() if line.strip()]
            files[f"c{concurrent}"] = (samples, {str(o["doc_id"]): o for o in lines})
    return files


READ_WITH_INSPECT_AI = """
import json, sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from flakecheck.harness.inspect_log import read_inspect_log
json.dump(read_inspect_log(Path(sys.argv[2]), use_inspect_ai=True), open(sys.argv[3], "w"))
"""


def test_inspect_ais_reader_and_flakecheck_s_own_read_the_same_samples(inspect_logs, tmp_path: Path) -> None:
    """flakecheck[inspect] reads through inspect_ai (run here in .venv-inspect, which has it); without it, the
    documented format (.eval: zstd members) is read directly. Both must give the same samples."""
    from flakecheck.harness.inspect_log import read_inspect_log
    from flakecheck.harness.inspect_samples import parse_inspect_log

    for name, (log, _) in inspect_logs.items():
        dumped = tmp_path / f"{name}.json"
        harness([str(INSPECT_PY), "-c", READ_WITH_INSPECT_AI, str(ROOT), str(log), str(dumped)], tmp_path, {})
        through_inspect_ai = parse_inspect_log(json.loads(dumped.read_text()), log)
        own = parse_inspect_log(read_inspect_log(log, use_inspect_ai=False), log)
        assert own.samples == through_inspect_ai.samples and len(own.samples) == len(QUESTIONS)
        assert (own.task, own.model, own.concurrency, own.scorer) == (through_inspect_ai.task, through_inspect_ai.model,
                                                                      through_inspect_ai.concurrency,
                                                                      through_inspect_ai.scorer)


def replay(suite: Path, model, out: Path):
    return run_suite(suite, model=model, kernels="splitk", compositions=resolve_compositions(None, ["name=solo"]),
                     out=out, html=False)


def test_inspect_runs_import_with_their_verdicts_and_divergences_and_replay_exactly(
        inspect_logs, serve_model, capsys, tmp_path: Path) -> None:
    (c1_log, c1), (c16_log, c16) = inspect_logs["c1"], inspect_logs["c16"]
    code, _, err = run_cli(capsys, "import", "inspect", c1_log, c16_log, "--out", tmp_path / "run", "--suite",
                           tmp_path / "suite.jsonl", "--no-html")
    assert code == 0, err
    run = load_run(tmp_path / "run")
    assert set(run.cases.case_id) == {sid for sid, _ in c1} and run.meta["import"]["divergence_by"]["text"] == 0
    for (sample_id, epoch), ref in c1.items():
        part = parting(ref["token_bytes"], c16[(sample_id, epoch)]["token_bytes"])
        assert diverged(run.cases, sample_id) == (part is not None), sample_id
        assert reported(run.cases, sample_id, "first_divergence") == part
    for row in run.runs.itertuples():
        logged = (c1 if row.composition == "c1" else c16)[(row.case_id, 1)]
        assert row.passed == (logged["scores"]["includes"] == "C")

    solo = replay(tmp_path / "suite.jsonl", serve_model, tmp_path / "replay")
    for row in solo.runs.itertuples():
        logged = c1[(row.case_id, 1)]
        assert row.text == logged["completion"] and row.n_tokens == len(logged["token_bytes"]), row.case_id
        assert row.passed == (logged["scores"]["includes"] == "C")  # the mapped scorer grades as inspect did


def test_lm_eval_runs_import_by_text_with_their_verdicts_and_replay_exactly(
        lmeval_samples, serve_model, capsys, tmp_path: Path) -> None:
    (c1_file, c1), (c8_file, c8) = lmeval_samples["c1"], lmeval_samples["c8"]
    code, _, err = run_cli(capsys, "import", "lm-eval", c1_file, c8_file, "--out", tmp_path / "run", "--suite",
                           tmp_path / "suite.jsonl", "--no-html")
    assert code == 0, err
    run = load_run(tmp_path / "run")
    assert [c["name"] for c in run.meta["compositions"]] == ["c1", "c8"]
    assert run.meta["import"]["divergence_by"]["text"] == len(c1)
    for doc_id, ref in c1.items():
        a, b = ref["resps"][0][0], c8[doc_id]["resps"][0][0]
        assert diverged(run.cases, doc_id) == (a != b), doc_id
        step = reported(run.cases, doc_id, "first_divergence")
        if step is not None:
            units = run.tokens[(run.tokens.case_id == doc_id) & (run.tokens.composition == "c1")].sort_values("step")
            before = "".join(units.token.iloc[:int(step)])
            assert a.startswith(before) and b.startswith(before)
            assert a[len(before):len(before) + 1] != b[len(before):len(before) + 1] or len(a) != len(b)
    for row in run.runs.itertuples():
        assert row.passed == ((c1 if row.composition == "c1" else c8)[row.case_id]["exact_match"] == 1.0)

    solo = replay(tmp_path / "suite.jsonl", serve_model, tmp_path / "replay")  # stop sequences included
    for row in solo.runs.itertuples():
        assert row.text == c1[row.case_id]["resps"][0][0], row.case_id
        assert row.passed == (c1[row.case_id]["exact_match"] == 1.0)  # the mapped metric grades as lm-eval did
