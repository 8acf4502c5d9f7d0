#!/usr/bin/env bash
# Create the eval-harness venvs the harness tests (tests/test_harness_real.py) drive as subprocesses:
#   .venv-inspect: inspect-ai + openai (inspect's `openai-api` provider needs the openai client)
#   .venv-lmeval:  lm-eval[api] (plain lm-eval lacks tenacity, which its API models import)
#
# Kept apart from the project's .venv: each harness pins its own dependencies, and flakecheck must read
# their logs without importing them (the optional extra flakecheck[inspect] is tested separately).
# Idempotent: a stamp file per venv records its pins; a venv made with other pins is rebuilt.
set -euo pipefail
cd "$(dirname "$0")/.."

INSPECT_VENV="${INSPECT_VENV:-.venv-inspect}"
LMEVAL_VENV="${LMEVAL_VENV:-.venv-lmeval}"
INSPECT_PINS="${INSPECT_PINS:-inspect-ai==0.3.285 openai==3.57.0}"
LMEVAL_PINS="${LMEVAL_PINS:-lm-eval[api]==0.4.13}"

make_venv() {  # make_venv DIR "PINS" "IMPORT CHECK"
    local venv="$1" pins="$2" check="$3" stamp="$1/.harness-installed"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$pins" ]]; then
        return 0
    fi
    local start
    start=$(date +%s)
    echo "creating $venv ($pins); this takes a minute or two" >&2
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    # shellcheck disable=SC2086  # the pins are a word list on purpose
    "$venv/bin/python" -m pip install -q $pins
    "$venv/bin/python" -c "$check"
    echo "$pins" > "$stamp"
    echo "$venv ready in $(( $(date +%s) - start )) s" >&2
}

make_venv "$INSPECT_VENV" "$INSPECT_PINS" \
    "import inspect_ai, openai; print('inspect_ai', inspect_ai.__version__, 'openai', openai.__version__)"
make_venv "$LMEVAL_VENV" "$LMEVAL_PINS" \
    "import lm_eval, tenacity; from importlib.metadata import version; print('lm_eval', version('lm-eval'))"
