# One venv per checkout; every target works on a fresh machine (torch: the CPU wheel on disk).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
TORCH  ?= torch==2.13.0
EXTRAS ?= dev

.PHONY: install test run check bench clean

$(VENV)/.installed-$(EXTRAS): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e ".[$(EXTRAS)]"
	touch $@

install: $(VENV)/.installed-$(EXTRAS)

## make test: install into .venv, then run the test suite (what CI runs)
test: install
	$(PY) -m pytest -q

## make run: the main job. Until serving lands (issue: FastAPI server) it runs the self-check.
run: install
	$(VENV)/bin/irpe check

check: run

## make bench: forward time of DeiT-S plain / iRPE-K / iRPE-QKV on CPU (bs 8, 2 threads)
bench: install
	$(PY) -m benchmarks.deit_forward

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
