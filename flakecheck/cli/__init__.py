"""The command line: a thin layer over the Python API. Exit codes: 0 ok, 1 gate failed or a
non-invariant op under the invariant policy, 2 bad input or usage, 3 internal error.

Every command imports what it runs inside its function: this module is loaded for every command (and for
`--help`), and torch, pandas and pyarrow would add seconds to each."""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import Any

import typer

from flakecheck.cli.imports import import_app
from flakecheck.cli.options import declared_options
from flakecheck.errors import UserError
from flakecheck.grading.external import DEFAULT_TIMEOUT_S as GRADER_TIMEOUT_S
from flakecheck.reports.formats import format_help
from flakecheck.run.options import cli_options

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Find the eval cases that flip at temperature 0 under batch composition, and why.\n\n"
    "Example: flakecheck run suites/demo.jsonl && flakecheck gate reports/demo-*/",
)
kernels_app = typer.Typer(
    no_args_is_help=True, help="Probe the kernel policies. Example: flakecheck kernels check --json"
)
app.add_typer(kernels_app, name="kernels")
app.add_typer(import_app, name="import")


def format_option(command: str) -> Any:
    """`--format`, the same option on every command that renders (flakecheck/reports/formats.py)."""
    return typer.Option([], "--format", metavar="NAME[=PATH]", help=format_help(command))


def deprecated(flag: str) -> str:
    return f"deprecated: {flag}"


@app.command("run",
             help="Replay a suite under batch compositions and write a run directory.\n\n"
             "Example: flakecheck run suites/demo.jsonl --kernels splitk --limit 20")
@declared_options(cli_options("run"))  # every option declared once in flakecheck/run/options.py
def run_cli(suite: Path = typer.Argument(..., help="suite JSONL, one case per line"), **options: Any) -> None:
    from flakecheck.cli.run import run_from_cli

    run_from_cli(suite, **options)


@app.command("probe",
             help="Probe a real OpenAI-compatible server (vLLM, SGLang, llama.cpp, a hosted API) at several load "
             "levels and write the same run directory as `run`.\n\n"
             "Example: flakecheck probe suites/demo.jsonl --endpoint http://127.0.0.1:8000 --concurrency 1,8,32")
def probe_cli(
    suite: Path = typer.Argument(..., help="suite JSONL, one case per line"),
    endpoint: str = typer.Option(..., help="the server's base URL, e.g. http://127.0.0.1:8000 (or .../v1)"),
    model: str | None = typer.Option(None, help="model name (default: the first id of GET /v1/models)"),
    api: str | None = typer.Option(None, help="chat | completions (default: `prompt` strings to completions, "
                                   "every other input to chat)"),
    api_key_env: str | None = typer.Option(None, help="name of the environment variable that holds the API key"),
    dtype: str | None = typer.Option(None, help="the server's logits dtype (bfloat16 | float16 | float32), which "
                                     "sizes a tie for the flip kinds; default unknown"),
    concurrency: str = typer.Option("1,8,32", help="requests in flight per load level; 1 is the reference"),
    fillers: int = typer.Option(0, help="filler requests kept in flight beside the cases at each level above 1"),
    prefix: bool = typer.Option(False, "--prefix", help="also a 'prefix' level: each case right after a warm-up "
                                "with the same prompt, prefix caching allowed"),
    repeat: str = typer.Option("1", help="probe the levels N times with other order seeds; auto: a case gets "
                               "rounds only while it is undecided (no flip yet, or its interval holds 10%; at most 8, "
                               "4 a case on average; see docs/flip-probability.md)"),
    max_tokens: int = typer.Option(64, help="default max new tokens per case"),
    limit: int | None = typer.Option(None, help="only the first N cases"),
    ids: str | None = typer.Option(None, help="only these case ids, comma-separated"),
    out: Path | None = typer.Option(None, help="run directory (default reports/<suite>-<UTC time>)"),
    resume: bool = typer.Option(False, help="continue an interrupted probe in --out"),
    isolation: str = typer.Option("salt", help="salt: a unique cache_salt and cache_prompt=false per request, so "
                                  "no request reuses another's cached prefix | none: send neither field"),
    timeout: float = typer.Option(600.0, help="seconds per HTTP attempt"),
    retries: int = typer.Option(5, help="retries per request (timeouts, resets, 429, 5xx), with backoff"),
    gap_threshold: float = typer.Option(0.05, help="a top1-top2 logprob gap below this is a near-tie"),
    gap_window: int = typer.Option(50, help="near-ties count within the first N tokens of the reference"),
    no_html: bool = typer.Option(False, "--no-html", help="skip report.html"),
    quiet: bool = typer.Option(False, help="print only the summary line"),
    noise: Path | None = typer.Option(None, help="a `flakecheck conformance` directory: predict each case's flip "
                                      "probability from that server's measured noise (one serial pass is enough)"),
    noise_in_flight: int | None = typer.Option(None, help="--noise: the requests in flight to predict for "
                                               "(default: this probe's highest level; a serial probe: the largest load "
                                               "the profile measured)"),
) -> None:
    from flakecheck.cli.probe import probe_from_cli

    probe_from_cli(
        suite, endpoint=endpoint, model=model, api=api, api_key_env=api_key_env, dtype=dtype,
        concurrency=concurrency, fillers=fillers, prefix=prefix, repeat=repeat, max_tokens=max_tokens, limit=limit,
        ids=ids, out=out, resume=resume, isolation=isolation, timeout=timeout, retries=retries,
        gap_threshold=gap_threshold, gap_window=gap_window, html=not no_html, quiet=quiet, noise=noise,
        noise_in_flight=noise_in_flight,
    )


@app.command("conformance",
             help="Which invariance does this server keep? One axis at a time against a serial reference: run to "
             "run, co-resident sequences (2, 4, ... up to --max-batch in flight), arrival position, prefix cache, "
             "chunked prefill, request shape; each reads holds, tokens hold or breaks. Writes conformance.json, "
             "conformance.md and the server's noise profile (noise.json, for `probe --noise`).\n\n"
             "Example: flakecheck conformance --endpoint http://127.0.0.1:8000 --expect invariant")
def conformance_cli(
    endpoint: str = typer.Option(..., help="the server's base URL, e.g. http://127.0.0.1:8000 (or .../v1)"),
    model: str | None = typer.Option(None, help="model name (default: the first id of GET /v1/models)"),
    api: str = typer.Option("completions", help="chat | completions: how the generated prompts are sent"),
    api_key_env: str | None = typer.Option(None, help="name of the environment variable that holds the API key"),
    dtype: str | None = typer.Option(None, help="the server's logits dtype (bfloat16 | float16 | float32), which "
                                     "sizes a tie for the flip kinds; default unknown"),
    expect: str | None = typer.Option(None, help="invariant (every axis must hold) | serial (run to run must "
                                      "hold): exit 1 when an expected axis does not, naming it"),
    max_batch: int = typer.Option(64, help="the co-resident sweep: 2, 4, 8, ... up to this many requests in flight"),
    targets: int = typer.Option(4, help="generated target prompts (seeded: two servers get the same requests)"),
    suite: Path | None = typer.Option(None, help="also use this suite's cases as targets"),
    limit: int | None = typer.Option(None, help="--suite: only its first N cases"),
    max_tokens: int = typer.Option(16, help="tokens per target answer"),
    burst: int = typer.Option(8, help="requests in flight in the arrival-position bursts"),
    chunk_budget: int = typer.Option(512, help="the server's prefill chunk budget in tokens (vLLM's "
                                     "--max-num-batched-tokens); the chunked-prefill prompt is longer"),
    seed: int = typer.Option(0, help="the seed the workload is generated with"),
    out: Path | None = typer.Option(None, help="conformance directory (default reports/conformance-<UTC time>)"),
    resume: bool = typer.Option(False, help="continue an interrupted check in --out"),
    timeout: float = typer.Option(600.0, help="seconds per HTTP attempt"),
    retries: int = typer.Option(5, help="retries per request (timeouts, resets, 429, 5xx), with backoff"),
    format: list[str] = format_option("conformance"),
    json_out: bool = typer.Option(False, "--json", help=deprecated("--format json")),
    markdown: Path | None = typer.Option(None, help=deprecated("--format markdown=PATH")),
    quiet: bool = typer.Option(False, help="no progress lines"),
) -> None:
    from flakecheck.cli.conformance import conformance_from_cli
    from flakecheck.probe.conformance import ConformanceConfig

    config = ConformanceConfig(endpoint, model=model, api=api, api_key_env=api_key_env, dtype=dtype, suite=suite,
                               limit=limit, targets=targets, max_tokens=max_tokens, max_batch=max_batch, burst=burst,
                               chunk_budget=chunk_budget, seed=seed, expect=expect, out=out, timeout=timeout,
                               retries=retries)
    raise typer.Exit(conformance_from_cli(config, resume=resume, json_out=json_out, markdown=markdown, quiet=quiet,
                                         formats=format))


@app.command("compare",
             help="Hold two diagnoses of one suite against each other (e.g. a simulated run and a probe).\n\n"
             "Example: flakecheck compare reports/sim reports/vllm --format json")
def compare_cli(
    run_a: Path = typer.Argument(..., help="run directory A (its predicted flip probability is the predictor)"),
    run_b: Path = typer.Argument(..., help="run directory B (its divergences are what is predicted)"),
    format: list[str] = format_option("compare"),
    json_out: bool = typer.Option(False, "--json", help=deprecated("--format json")),
) -> None:
    from flakecheck.reports.compare import compare_command

    raise typer.Exit(compare_command(run_a, run_b, json_out=json_out, formats=format))


@app.command("diff",
             help="Compare two versions of a suite, a prompt or a model, case by case, against each side's own "
             "batch-composition spread. A and B are two run directories, or two suite files that diff runs "
             "first under the same compositions (into --out/a and --out/b). Cases pair by id (by position, with a "
             "warning, when the ids differ but the counts match). Over every pairing of a composition of A with "
             "one of B: regression = A passes under every composition of A and B fails under every composition "
             "of B; improvement = the reverse; noise = the verdicts differ in some pairing but at least one side's "
             "own compositions already disagree; same = the same verdict under every pairing and some answer "
             "shared; changed-text = the same verdict under every pairing, but no answer of B is one A gave. The "
             "score change is B's mean score over its compositions minus A's; its interval is the lowest and "
             "highest difference over every pairing of compositions (draws, when both runs have them). Exit 1 "
             "when regressions exceed --max-regressions or every pairing shows a drop beyond --max-score-drop.\n\n"
             "Example: flakecheck diff suites/demo.jsonl suites/demo-prompt-edit.jsonl --limit 61")
@declared_options(cli_options("diff"), unset="suites: ")  # `run`'s options, as flakecheck/run/options.py declares them
def diff_cli(
    a: Path = typer.Argument(..., help="before: a run directory, or a suite file"),
    b: Path = typer.Argument(..., help="after: a run directory, or a suite file"),
    format: list[str] = format_option("diff"),
    json_out: bool = typer.Option(False, "--json", help=deprecated("--format json")),
    markdown: Path | None = typer.Option(None, help=deprecated("--format markdown=PATH")),
    html_out: Path | None = typer.Option(None, "--html", help=deprecated("--format html=PATH")),
    junit: Path | None = typer.Option(None, help=deprecated("--format junit=PATH") + " (a regression fails, noise "
                                      "is flaky)"),
    max_regressions: int = typer.Option(0, help="fail when more cases regress beyond batch noise"),
    max_score_drop: float | None = typer.Option(0.0, help="fail when every pairing of compositions shows the score "
                                                "drop by more than this many percentage points"),
    top: int = typer.Option(30, help="how many differing cases to list"),
    out: Path | None = typer.Option(None, help="suites: the directory for both runs (default reports/diff-<UTC "
                                    "time>); diff.json and diff.html go there too"),
    model_b: str | None = typer.Option(None, help="suites: B's model, to compare two models on one suite"),
    quiet: bool = typer.Option(False, help="suites: no progress bars"),
    **run: Any,
) -> None:
    from flakecheck.cli.diff import diff_from_cli, run_options

    raise typer.Exit(diff_from_cli(a, b, run_options(run), model_b=model_b, out=out, quiet=quiet, json_out=json_out,
                                   markdown=markdown, html=html_out, junit=junit, max_regressions=max_regressions,
                                   max_score_drop=max_score_drop, top=top, formats=format))


@app.command("report",
             help="Render a run directory (no model needed).\n\n"
             "Example: flakecheck report reports/demo-20261201T120000Z --format markdown")
def report_cli(
    run_dir: Path = typer.Argument(..., help="a run directory written by `flakecheck run`"),
    format: list[str] = format_option("report"),
    html: Path | None = typer.Option(None, help="also write the HTML report to this file (--format html=PATH)"),
    top: int = typer.Option(10, help="how many cases to list by risk"),
) -> None:
    from flakecheck.cli.report import report_command

    raise typer.Exit(report_command(run_dir, format=format, html=html, top=top))


@app.command("gate",
             help="A CI regression gate over a run directory: exit 1 when it fails.\n\n"
             "Example: flakecheck gate reports/now --baseline reports/main --max-flaky-rate 0.05 "
             "--format junit=flakes.xml")
def gate_cli(
    run_dir: Path = typer.Argument(..., help="the run directory to judge"),
    baseline: Path | None = typer.Option(None, help="a run directory to compare against"),
    max_flaky_rate: float | None = typer.Option(None, help="fail when (flaky + verdict_flaky) / cases exceeds this"),
    max_verdict_flips: int | None = typer.Option(None, help="fail when more cases flip their verdict"),
    fail_on_new_fragile: bool = typer.Option(False, help="with --baseline: fail on newly fragile cases too"),
    quarantine: Path | None = typer.Option(None, help="file of case ids with reason and expiry"),
    format: list[str] = format_option("gate"),
    junit: Path | None = typer.Option(None, help=deprecated("--format junit=PATH")),
    markdown: Path | None = typer.Option(None, help=deprecated("--format markdown=PATH")),
    max_score_swing: float | None = typer.Option(None, help="fail when the score swing (best-case minus worst-case "
                                                 "score over compositions) exceeds this many percentage points"),
    max_flip_probability: float | None = typer.Option(None, help="fail a case shown to flip in more than this "
                                                      "share of draws (its exact 95% interval's lower bound is above "
                                                      "it; cases whose interval holds it are named as undecided); "
                                                      "needs a run with --sample, or a probe with --repeat"),
    max_score_std: float | None = typer.Option(None, help="fail when the score's standard deviation over the draws "
                                               "exceeds this many percentage points"),
    min_pass_rate: float | None = typer.Option(None, help="fail a case that passes in fewer than this share of its "
                                               "runs (compositions x repeats); 1 is pass^k: every run must pass"),
) -> None:
    from flakecheck.gate.gate import gate_command

    raise typer.Exit(gate_command(
        run_dir, baseline=baseline, max_flaky_rate=max_flaky_rate, max_verdict_flips=max_verdict_flips,
        fail_on_new_fragile=fail_on_new_fragile, quarantine=quarantine, junit=junit, markdown=markdown,
        max_score_swing=max_score_swing, max_flip_probability=max_flip_probability, max_score_std=max_score_std,
        min_pass_rate=min_pass_rate, formats=format,
    ))


@app.command("explain",
             help="Which mechanism alone reproduces each diverged case's flip (matmul split-K, attention split-KV, "
             "norm splits, chunked prefill, prefix cache, batch size), and the smallest fix, replayed and priced. "
             "Writes attribution.parquet, fixes.parquet and explain.json into the run directory.\n\n"
             "Example: flakecheck explain reports/demo-20261201T120000Z --ids code-01,math-02")
def explain_cli(
    run_dir: Path = typer.Argument(..., help="a run directory written by `flakecheck run`"),
    ids: str | None = typer.Option(None, help="only these diverged case ids, comma-separated"),
    format: list[str] = format_option("explain"),
    json_out: bool = typer.Option(False, "--json", help=deprecated("--format json")),
    steps_after: int = typer.Option(4, help="replay each case this many tokens past its first divergence"),
    grader: str | None = typer.Option(None, help="grade the fixed outputs with this command (default: the run's "
                                      "grader, else the suite's checks)"),
    grader_timeout: float = typer.Option(GRADER_TIMEOUT_S, help="seconds the --grader process may take"),
    suite: Path | None = typer.Option(None, help="the run's suite file, if it moved (its sha256 must match)"),
    no_fixes: bool = typer.Option(False, "--no-fixes", help="attribution only: skip replaying and pricing fixes"),
    top: int = typer.Option(20, help="how many cases to list"),
    quiet: bool = typer.Option(False, help="no progress bar"),
    ray: str | None = typer.Option(None, "--ray", help="the targeted replays in shards on a Ray cluster: --ray "
                                   "alone starts a local one, --ray auto joins the running one, or give its address"),
    workers: int = typer.Option(2, help="--ray: replay actors (each loads the model once)"),
    cpus_per_worker: int | None = typer.Option(None, help="--ray: CPUs (threads) per actor (default: shared out)"),
    allow_mixed_devices: bool = typer.Option(False, help="--ray: run even when actors' machines differ"),
    device: str | None = typer.Option(None, help="replay on this device (auto | cpu | cuda | cuda:N) instead of "
                                      "the one the run recorded"),
) -> None:
    from flakecheck.cli.explain import explain_from_cli

    raise typer.Exit(explain_from_cli(run_dir, ids, json_out, steps_after, grader, grader_timeout, suite,
                                      not no_fixes, top, quiet, ray, workers, cpus_per_worker, allow_mixed_devices,
                                      device, formats=format))


@app.command("repro",
             help="Write a self-contained directory that reproduces one case's flip: its suite lines, the two "
             "compositions, a script that replays them and checks the divergence (exit 0 when it reproduces), "
             "and the probe command for a server.\n\nExample: flakecheck repro reports/demo-splitk code-01")
def repro_cli(
    run_dir: Path = typer.Argument(..., help="a run directory written by `flakecheck run`"),
    case_id: str = typer.Argument(..., help="a case that diverged in that run"),
    out: Path | None = typer.Option(None, help="the directory to write (default RUN_DIR/repro/CASE_ID)"),
    suite: Path | None = typer.Option(None, help="the run's suite file, if it moved (its sha256 must match)"),
) -> None:
    from flakecheck.cli.explain import repro_from_cli

    raise typer.Exit(repro_from_cli(run_dir, case_id, out, suite))


@kernels_app.command("check", help="On this machine: which ops are batch-invariant under each policy, the "
                     "machine's fingerprint, and what a run verifies and falls back to; exit 1 if the invariant "
                     "policy is not invariant here.\n\nExample: flakecheck kernels check --json")
def kernels_check(
    device: str = typer.Option("auto", help="auto (CUDA when torch sees a GPU, else cpu) | cpu | cuda | cuda:N"),
    dtype: str = typer.Option("bfloat16", help="bfloat16 | float16 | float32"),
    backend: str = typer.Option("auto", help="auto | torch | triton"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON object"),
    fresh: bool = typer.Option(False, "--fresh", help="run the self-check again instead of reading its cache"),
    kernels: list[str] = typer.Option([], help="a policy `run --kernels` takes (tp-invariant, or one per op class: "
                                      "matmul=splitk,attention=invariant,norm=invariant), measured and self-checked "
                                      "beside splitk, invariant, native and tp-invariant; repeatable"),
) -> None:
    from flakecheck.engine.settings import parse_kernels
    from flakecheck.machine.device import Device
    from flakecheck.machine.kernels_check import check_command

    policies = tuple(parse_kernels(k) for k in kernels)
    raise typer.Exit(check_command(device=Device.parse(device), dtype=dtype, backend=backend, json_out=json_out,
                                   fresh=fresh, policies=policies))


@kernels_app.command("compile", help="Compile every Triton kernel x every launch configuration the engine uses "
                     "(SmolLM2-135M, Gemma 3 270M, an 8B Llama) for NVIDIA targets, without a GPU: instruction, "
                     "registers, spills, shared memory, and each matmul's instruction boundaries; exit 1 if one fails "
                     "to compile, spills, exceeds shared memory, or a boundary is not probed by the self-check."
                     "\n\nExample: flakecheck kernels compile --target sm_90,sm_100")
def kernels_compile(
    target: str = typer.Option("sm_80,sm_89,sm_90,sm_100", help="comma-separated: sm_80 | sm_89 | sm_90 | sm_100 | "
                               "sm_120"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON object"),
    jobs: int = typer.Option(0, help="compiler processes (0: one per CPU core)"),
) -> None:
    from flakecheck.kernels.compile_check import compile_command

    raise typer.Exit(compile_command(targets=target, json_out=json_out, jobs=jobs or None))


@app.command("serve",
             help="The built-in engine behind an OpenAI-compatible API (continuous batching, greedy, top-2 "
             "logprobs).\n\nExample: flakecheck serve --kernels invariant --port 8000")
@declared_options(cli_options("serve"))  # the engine's options, as `run` takes them
def serve_cli(
    host: str = typer.Option("127.0.0.1", help="address to listen on (loopback by default)"),
    port: int = typer.Option(8000, help="port; 0 picks a free one (printed at start-up)"),
    max_num_seqs: int = typer.Option(32, help="most sequences in one engine step"),
    max_num_batched_tokens: int | None = typer.Option(None, help="token budget a step (chunked prefill)"),
    enable_prefix_caching: bool = typer.Option(False, help="reuse cached prompt blocks across requests"),
    max_model_len: int | None = typer.Option(None, help="cap the context below the model's (bounds the KV cache)"),
    served_model_name: str | None = typer.Option(None, help="the model id the API reports (default: --model)"),
    quiet: bool = typer.Option(False, help="no access log (by default one line per request on stderr: method, "
                               "path, status, latency, request id, token counts; never a body or a key)"),
    record_responses: Path | None = typer.Option(None, help="append one JSON line per answer to this file: its "
                                                 "text, tokens and top-2 logprobs, keyed by a hash of the prompt "
                                                 "(`flakecheck import promptfoo --record` joins it)"),
    **engine: Any,
) -> None:
    from flakecheck.cli.serve import serve_command
    from flakecheck.serve.state import ServeSettings

    settings = ServeSettings.parse(**engine, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                   enable_prefix_caching=enable_prefix_caching, max_model_len=max_model_len,
                                   served_model_name=served_model_name)
    serve_command(settings, host, port, quiet, record_responses)


@app.command("bench",
             help="Benchmarks, one JSON line each: engine | kernels | run | pinning | scale | calibration | "
             "row_share | tp.\n\nExample: flakecheck bench run --json")
def bench_cli(
    target: str = typer.Argument("engine", help="engine | kernels | run | pinning (what the pinned settings cost) | "
                                 "scale (one process against a local Ray cluster) | calibration (predicted vs observed "
                                 "flip probability, and what --sample costs) | row_share (what the row store saves "
                                 "--sample auto) | tp (demo flips across TP 1 and 3 beside batch sizes, and what the "
                                 "tp-invariant order costs)"),
    json_out: bool = typer.Option(False, "--json", help="print only the JSON line"),
    quick: bool = typer.Option(False, help="a smaller workload (smoke test of the benchmark itself)"),
    cases: int | None = typer.Option(None, help="run, pinning, scale, tp: demo cases to replay (default 24; pinning "
                                     "12)"),
    repeats: int | None = typer.Option(None, help="run, pinning, tp: times each side runs (default 1; pinning 3; tp: "
                                       "decode-step turns, 15)"),
    suite: Path | None = typer.Option(None, help="scale: time this suite in one process (e.g. suites/large.jsonl)"),
    ray: str | None = typer.Option(None, "--ray", help="run: time the simulated side on a Ray cluster too (--ray "
                                   "alone: a local one; auto; or an address)"),
    workers: int = typer.Option(2, help="run --ray: replay actors"),
    limit: int | None = typer.Option(None, help="calibration: only the first N demo cases (default all 111); "
                                     "row_share: (default 4)"),
    sample: int | None = typer.Option(None, help="calibration: compositions to sample (default 32)"),
    device: str = typer.Option("auto", help="engine, kernels: auto (CUDA when torch sees a GPU) | cpu | cuda | "
                               "cuda:N; the other benchmarks measure the CPU"),
    model: str = typer.Option("smollm2", help="engine: the model (smollm2 | gemma3-270m | a Hugging Face directory | "
                              "FILE.gguf), or several separated by commas, measured side by side in one process"),
    kernels: str = typer.Option("native", help="engine: the engine's kernels, any policy `run --kernels` takes "
                                "(native: the framework's own, what `generate` runs; splitk | invariant | "
                                "tp-invariant | one per op class: matmul=splitk,attention=invariant,norm=invariant)"),
) -> None:
    import importlib

    from flakecheck.engine.settings import parse_kernels
    from flakecheck.machine.device import Device

    targets = ("engine", "kernels", "run", "pinning", "scale", "calibration", "row_share", "tp")
    if target not in targets:
        raise UserError(f"unknown benchmark {target!r}; choose {', '.join(targets)}")
    resolved = Device.parse(device)
    policy = parse_kernels(kernels)
    if resolved.is_cuda and target not in ("engine", "kernels") and device != "auto":
        raise UserError(f"--device {device}: bench {target} measures the CPU; --device applies to bench engine and "
                        "bench kernels")
    module = importlib.import_module(f"flakecheck.bench.{target}")
    extra: dict = {"cases": cases, "repeats": repeats} if target in ("run", "pinning", "tp") else {}
    if target == "engine":
        extra = {"device": resolved, "model": model, "kernels": policy}
    if target == "kernels":
        extra = {"device": resolved}
    if target == "run" and ray is not None:
        extra.update(ray=ray, workers=workers)
    if target == "scale":
        extra = {"cases": cases, "suite": str(suite) if suite else None}
    if target == "calibration":
        for flag, value in (("--limit", limit), ("--sample", sample)):
            if value is not None and value < 1:
                raise UserError(f"{flag} must be an integer >= 1, got {value}")
        extra = {"limit": limit, "sample": sample}
    if target == "row_share":
        if limit is not None and limit < 1:
            raise UserError(f"--limit must be an integer >= 1, got {limit}")
        extra = {"limit": limit}
    module.main(json_out=json_out, quick=quick, **extra)


def ray_flag(argv: list[str]) -> list[str]:
    """`--ray` with no address means a local cluster: give it the value "local" (typer's options take one)."""
    out = []
    for i, arg in enumerate(argv):
        out.append(arg)
        if arg == "--ray":
            following = argv[i + 1] if i + 1 < len(argv) else None
            if following is None or not _is_ray_address(following):
                out.append("local")
    return out


def _is_ray_address(text: str) -> bool:
    return text in ("auto", "local") or text.startswith("ray://") or (":" in text and "/" not in text)


def main() -> None:
    sys.argv = ray_flag(sys.argv)
    try:
        code = app(standalone_mode=False)  # standalone_mode=False hands back the command's return code
        sys.exit(code if isinstance(code, int) else 0)
    except UserError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.BadParameter, typer.Abort) as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # the one place an unexpected error becomes exit 3
        if _is_click_error(exc):  # typer's own usage errors (unknown command, bad option)
            exc.show()
            sys.exit(2 if exc.exit_code == 2 or type(exc).__name__.endswith("UsageError") else exc.exit_code)
        traceback.print_exc()
        typer.echo(f"internal error: {exc}", err=True)
        sys.exit(3)


def _is_click_error(exc: Exception) -> bool:
    """Click's exceptions, whether typer vendors click or depends on it."""
    return any(cls.__name__ == "ClickException" for cls in type(exc).__mro__) and hasattr(exc, "show")
