#!/usr/bin/env bash
# The run-and-gate step of the GitHub Action (action.yml at the repository root), runnable on its own: the action's
# inputs arrive as FLK_* variables (never spliced into the script text), and tests/test_action.py runs it locally.
#
#   FLK_SUITE          a JSONL suite or a promptfoo config (promptfooconfig.yaml)            (required)
#   FLK_ENDPOINT       probe this OpenAI-compatible server (else the built-in engine runs FLK_MODEL)
#   FLK_MODEL          the model: the built-in engine's (smollm2, a directory, FILE.gguf), or the endpoint's name
#   FLK_KERNELS        the built-in engine's kernels: splitk | invariant | native             (default splitk)
#   FLK_CONCURRENCY    with FLK_ENDPOINT: the load levels                                     (default 1,8)
#   FLK_REPEAT         repeats per composition or load level                                  (default 1)
#   FLK_MAX_TOKENS     new tokens per case unless the case sets its own
#   FLK_MAX_FLAKY_RATE, FLK_MAX_VERDICT_FLIPS, FLK_MIN_PASS_RATE, FLK_MAX_SCORE_SWING, FLK_BASELINE: the gate's
#                      thresholds (see `flakecheck gate --help`); unset: the gate's defaults
#   FLK_DIFF_AGAINST   a run directory from before the change: `flakecheck diff` against it (regressions beyond batch
#                      noise fail; its markdown joins gate.md, its JUnit is diff.xml)
#   FLK_OUT            where the run directory, junit.xml and gate.md go                      (default flakecheck-report)
#   FLK_BIN            the flakecheck command                                                 (default flakecheck)
#
# The gate appends its markdown to $GITHUB_STEP_SUMMARY itself. Outputs (to $GITHUB_OUTPUT when set): passed
# (true|false), exit-code, run-dir, report (report.html), junit, markdown. Exit 0 when the gate ran, whatever its
# verdict (the action's last step fails the job, after the report is uploaded and the comment posted); the
# run's or the gate's own exit code (2 bad input, 3 internal error) otherwise.
set -euo pipefail

suite="${FLK_SUITE:?FLK_SUITE: give the suite or promptfoo config}"
read -r -a flk <<< "${FLK_BIN:-flakecheck}"
out="${FLK_OUT:-flakecheck-report}"
run_dir="$out/run"
mkdir -p "$out"
if [[ -e "$run_dir" ]]; then
    echo "error: $run_dir exists; give an empty FLK_OUT" >&2
    exit 2
fi

common=(--out "$run_dir" --repeat "${FLK_REPEAT:-1}")
[[ -n "${FLK_MAX_TOKENS:-}" ]] && common+=(--max-tokens "$FLK_MAX_TOKENS")
if [[ -n "${FLK_ENDPOINT:-}" ]]; then
    [[ -n "${FLK_MODEL:-}" ]] && common+=(--model "$FLK_MODEL")
    "${flk[@]}" probe "$suite" --endpoint "$FLK_ENDPOINT" --concurrency "${FLK_CONCURRENCY:-1,8}" "${common[@]}"
else
    "${flk[@]}" run "$suite" --model "${FLK_MODEL:-smollm2}" --kernels "${FLK_KERNELS:-splitk}" "${common[@]}"
fi

gate=(--junit "$out/junit.xml" --markdown "$out/gate.md")
[[ -n "${FLK_MAX_FLAKY_RATE:-}" ]] && gate+=(--max-flaky-rate "$FLK_MAX_FLAKY_RATE")
[[ -n "${FLK_MAX_VERDICT_FLIPS:-}" ]] && gate+=(--max-verdict-flips "$FLK_MAX_VERDICT_FLIPS")
[[ -n "${FLK_MIN_PASS_RATE:-}" ]] && gate+=(--min-pass-rate "$FLK_MIN_PASS_RATE")
[[ -n "${FLK_MAX_SCORE_SWING:-}" ]] && gate+=(--max-score-swing "$FLK_MAX_SCORE_SWING")
[[ -n "${FLK_BASELINE:-}" ]] && gate+=(--baseline "$FLK_BASELINE")
code=0
"${flk[@]}" gate "$run_dir" "${gate[@]}" || code=$?
if (( code > 1 )); then
    exit "$code"
fi
if [[ -n "${FLK_DIFF_AGAINST:-}" ]]; then
    diff_code=0
    "${flk[@]}" diff "$FLK_DIFF_AGAINST" "$run_dir" --junit "$out/diff.xml" --markdown "$out/diff.md" \
        --html "$out/diff.html" || diff_code=$?
    if (( diff_code > 1 )); then
        exit "$diff_code"
    fi
    { echo; cat "$out/diff.md"; } >> "$out/gate.md"
    (( diff_code == 1 )) && code=1
fi

passed=$([[ $code -eq 0 ]] && echo true || echo false)
if [[ -n "${GITHUB_OUTPUT:-}" ]]; then
    {
        echo "passed=$passed"
        echo "exit-code=$code"
        echo "run-dir=$run_dir"
        echo "report=$run_dir/report.html"
        echo "junit=$out/junit.xml"
        echo "markdown=$out/gate.md"
    } >> "$GITHUB_OUTPUT"
fi
echo "flakecheck gate: $([[ $passed == true ]] && echo passed || echo failed) ($run_dir)"
