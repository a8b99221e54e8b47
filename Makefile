# Quick start: `make demo` (train the tiny demo model on the bundled synthetic world)
# and `make test` (the test suite). Each creates .venv and installs what it needs.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
WORKDIR ?= runs/demo
export HF_HUB_OFFLINE=1
export TRANSFORMERS_OFFLINE=1

.PHONY: demo test install install-test clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(VENV)/.installed: setup.py | $(PY)
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.installed-test: setup.py | $(PY)
	$(PY) -m pip install -q -e ".[test]"
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

demo: $(VENV)/.installed
	$(PY) -m launch.train --config=configs/demo.py --workdir=$(WORKDIR)

test: $(VENV)/.installed-test
	$(PY) -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) runs *.egg-info
