# Two commands do all set-up: `make demo` and `make test` create (or reuse) .venv and install what they need.
# torch is installed first, on its own, from TORCH_SPEC and, if set, TORCH_INDEX (e.g. PyTorch's CPU wheel
# index on a machine without a GPU), so that later installs keep that build instead of pulling another.
PYTHON      ?= python3
VENV        ?= .venv
TORCH_SPEC  ?= torch==2.13.0
TORCH_INDEX ?=
PY          := $(VENV)/bin/python
PIP         := $(PY) -m pip --disable-pip-version-check

.PHONY: demo test chromium bench lab figures countdown clean

demo: $(VENV)/.deps-notebooks
	$(PY) -m setpo.cli demo

test: chromium $(VENV)/.deps-test
	$(PY) -m pytest -q

# tests/test_browser.py drives Debian's chromium (Playwright with the system browser, never `playwright install`):
# installed here when missing and this is root (CI), else a one-line instruction.
chromium:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && apt-get update -q && apt-get install -y -q chromium; } \
	  || { echo "make test needs chromium on PATH for tests/test_browser.py: sudo apt-get install chromium" >&2; exit 1; }

# The benchmarks include verl's trainer on the CPU (verl_cpu_step, verl_ray_nodes): the test install carries verl.
bench: $(VENV)/.deps-test
	$(PY) -m setpo.cli bench

# Runs notebooks 01, 02, 03 and 05 in full: writes figures/ and saves each notebook back with its outputs.
figures: $(VENV)/.deps-lab
	$(PY) -m setpo.cli figures

# The Countdown study (notebook 03's; kept in git in results/countdown, resumable across sittings), on the pinned
# floating-point path (setpo.arithmetic), so that its parts made on different machines are one experiment.
# headline_seeds: 7 seeds more for the headline pair (GRPO, chosen SetPO) in the main cell, 12 in all, sized from
# the noise of its first 5 (README, "How many seeds").
# results/countdown/requirements.txt: the package versions the record was made at (a fresh install resolves newer
# ones, and the study refuses to resume at other versions).
countdown: $(VENV)/.deps-lab
	$(PIP) install -q -r results/countdown/requirements.txt
	$(PY) -m setpo.cli countdown --full --set 'headline_seeds=[5,6,7,8,9,10,11]' --out results/countdown

# What the notebooks need (extra `lab`: figures + TRL and the embedders), not verl or Ray, on the pinned
# floating-point path (notebook 03 resumes the Countdown study). Containers often run as root, where Jupyter
# refuses to start without --allow-root.
lab: $(VENV)/.deps-lab
	$(PY) -m setpo.arithmetic $(PY) -m jupyter lab notebooks/ $(if $(filter 0,$(shell id -u)),--allow-root)

$(PY):
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "setpo needs Python 3.10 or newer, found " + sys.version.split()[0]'
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(VENV)/.torch: | $(PY)
	$(PIP) install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_SPEC)"
	@touch $@

# One stamp per set of extras; it is redone when pyproject.toml changes, so a second run is instant.
$(VENV)/.deps-%: pyproject.toml $(VENV)/.torch
	$(PIP) install -q -e ".[$*]"
	@touch $@

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
