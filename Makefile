# Quick start: `make demo` (train the tiny demo model on the bundled synthetic world)
# and `make test` (the test suite). Each creates .venv and installs what it needs.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
WORKDIR ?= runs/demo
export HF_HUB_OFFLINE=1
export TRANSFORMERS_OFFLINE=1

.PHONY: demo demo-grpo demo-mopd demo-miniwob test install install-test install-browser clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(VENV)/.installed: setup.py | $(PY)
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.installed-test: setup.py | $(PY)
	$(PY) -m pip install -q -e ".[test]"
	touch $@ $(VENV)/.installed

$(VENV)/.installed-miniwob: setup.py | $(PY)
	$(PY) -m pip install -q -e ".[miniwob]"
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

# The browser tests' pieces (MiniWoB++ in headless Chromium): Debian's chromium and
# chromium-driver (root, apt) and the [miniwob] extra. With them `make test` runs the
# Chromium tests instead of skipping them.
install-browser: $(VENV)/.installed-miniwob
	command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver)

demo: $(VENV)/.installed
	$(PY) -m launch.train --config=configs/demo.py --workdir=$(WORKDIR)

# Stage 2 on the demo world (after `make demo`): GRPO from the ASFT export.
demo-grpo: $(VENV)/.installed
	$(PY) -m launch.train --config=configs/grpo_demo.py --workdir=runs/grpo_demo \
	    --config.model.hf_path=$(WORKDIR)/export

# UI-MOPD on the demo world: two single-platform teachers, then the student.
demo-mopd: $(VENV)/.installed
	$(PY) -m launch.train --config=configs/mopd_demo.py:teacher_desktop --workdir=runs/mopd_demo/teacher_desktop
	$(PY) -m launch.train --config=configs/mopd_demo.py:teacher_mobile --workdir=runs/mopd_demo/teacher_mobile
	$(PY) -m launch.train --config=configs/mopd_demo.py:student --workdir=runs/mopd_demo/student

# MiniWoB++ in headless Chromium (needs `apt-get install chromium chromium-driver`): expert
# demos, ASFT of the tiny model, then online success of expert / random clicks / the model.
demo-miniwob: $(VENV)/.installed-miniwob
	$(PY) -m launch.record_demos --world=miniwob --out=runs/miniwob_demos --episodes=100 --scale=2
	$(PY) -m launch.copy_variants --input=runs/miniwob_demos/train.jsonl --out=runs/miniwob_demos/train_copy.jsonl --copies=10
	$(PY) -m launch.vision_probe --kind=click --box=large --out=runs/miniwob_probes/click_large
	$(PY) -m launch.vision_probe --kind=click --box=small --out=runs/miniwob_probes/click_small
	$(PY) -m launch.train --config=configs/miniwob.py --workdir=runs/miniwob_sft
	$(PY) -m launch.eval --config=configs/eval_demo.py --workdir=runs/miniwob_eval --config.world=miniwob \
	    --config.miniwob.scale=2 --config.online.episodes=20 --config.agents='("expert","random_click","checkpoint")' \
	    --config.agent_kwargs.checkpoint.workdir=runs/miniwob_sft

# Two pytest workers (TEST_WORKERS=0: one process): most of a test's time is XLA compiling on one
# core; a test file stays on one worker (--dist loadfile: its module fixtures are built once).
TEST_WORKERS ?= 2
test: $(VENV)/.installed-test
	$(PY) -m pytest -q --durations=25 -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) runs *.egg-info
