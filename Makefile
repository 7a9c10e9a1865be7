# Two commands do everything on a fresh clone: `make run` and `make test`.
# Every target creates .venv and installs the pinned requirements when they are missing.

# The course runs on Python >= 3.12 (what Colab and Kaggle run). Unless PYTHON=... is given,
# use the first Python >= 3.12 found: on PATH, then under pyenv (whose shims need
# PYENV_VERSION, so the interpreters are called directly).
PY_CANDIDATES := python3.12 python3.13 python3.14 python3 python \
  $(sort $(wildcard $(shell pyenv root 2>/dev/null)/versions/3.1[2-9]*/bin/python))
ifeq ($(origin PYTHON),undefined)
PYTHON := $(firstword $(foreach p,$(PY_CANDIDATES),$(shell $(p) -c 'import sys; print(sys.version_info >= (3, 12))' 2>/dev/null | grep -q True && command -v $(p))))
endif
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
NB     ?=

.PHONY: help run test test-1 test-2 test-presets test-accelerator test-devices test-latest lint sync data clean docs bench constraints

# Tests run with no network: in a network namespace with loopback only where the kernel
# allows one, and always with proxy variables at a closed port (tools/offline.py).
OFFLINE := $(BIN)/python tools/offline.py --no-network --

help:
	@echo "make run           execute every notebook in place (NB=01_minigpt for one; ACCELERATOR=1 on the attached GPU/TPU)"
	@echo "make test          the whole test suite: notebooks under nbval on 8 CPU devices, pairs, hygiene, lint"
	@echo "make test-1        every notebook under nbval on 1 emulated device (the Colab CPU case; CI runs it)"
	@echo "make test-2        every notebook on 2 emulated devices: the (data, model) = (1, 2) mesh (CI runs it)"
	@echo "make test-presets  the readers' GPU/TPU presets (shapes, dtypes, schedules) for a few steps on this CPU (CI runs it)"
	@echo "make test-accelerator  every notebook on the attached GPU/TPU, every check asserting, one line each (JOBS=4: four at once on a GPU)"
	@echo "make test-devices  execute every notebook at 1, 2 and 4 emulated devices"
	@echo "make test-latest   every notebook under nbval with the newest release of every requirement (.venv-latest)"
	@echo "make sync          write the notebooks' copies of course/*.py, then pair md/ and notebooks/ (newest side wins)"
	@echo "make lint          ruff over notebooks and code"
	@echo "make data          write the offline tokenizer cache and corpus under .cache/"
	@echo "make bench         speed vs the seed baselines and the hardware (NBVAL=0 skips the notebooks' wall times)"
	@echo "make docs          build the documentation site from the committed notebooks into _build/html"
	@echo "make constraints   after editing requirements.txt: reinstall from it and freeze constraints.txt"

$(STAMP): requirements.txt constraints.txt
	@test -n "$(PYTHON)" && $(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null || { \
	  echo "make: the course needs Python >= 3.12 (JAX 0.12 dropped 3.11) and found none$(if $(PYTHON), ($(PYTHON) is $$($(PYTHON) -V 2>&1))); install one, or run make PYTHON=/path/to/python3.12 $(MAKECMDGOALS)"; exit 1; }
	@# a .venv left by an older Python (the course ran on 3.11 before) is rebuilt
	@if [ -x $(BIN)/python ] && ! $(BIN)/python -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then \
	  echo "make: $(VENV) was made by $$($(BIN)/python -V); rebuilding it with $(PYTHON)"; rm -rf $(VENV); fi
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt -c constraints.txt
	touch $@

data: $(STAMP)
	$(BIN)/python tools/offline.py

run: $(STAMP)
	$(if $(filter 1,$(ACCELERATOR)),COURSE_ACCELERATOR=1) $(BIN)/python tools/execute.py $(NB)

# pytest exits 5 when it collected no test: an ARGS that selects nothing is a mistake, not a pass.
test: $(STAMP)
	@$(OFFLINE) $(BIN)/python -m pytest $(ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: FAILED: pytest collected no tests$(if $(ARGS), (ARGS=$(ARGS) selects nothing))"; fi; exit $$rc

# Colab's CPU runtime has one device and no libtpu: every notebook must pass there too (outputs
# not compared). COURSE_TPU_COMPILE=0 makes the TPU cells take their no-libtpu path; the TPU
# compiles do not depend on the CPU device count, and `make test` runs them. The notebooks that
# train for long run a few steps (tools/run_notebooks.py, CAPS); `make test-devices` runs them whole.
test-1: $(STAMP)
	@$(OFFLINE) $(BIN)/python tools/run_notebooks.py devices 1 $(NB)

# The (data, model) = (1, 2) mesh: what a reader with two GPUs (Kaggle's 2 x T4) or a two-device
# host gets, and the one layout that neither 8 nor 1 device covers. Capped as test-1 is.
test-2: $(STAMP)
	@$(OFFLINE) $(BIN)/python tools/run_notebooks.py devices 2 $(NB)

# Each notebook's GPU/TPU presets on this CPU, caps in tools/run_notebooks.py (PRESET_RUNS).
test-presets: $(STAMP)
	@$(OFFLINE) $(BIN)/python tools/run_notebooks.py presets $(NB)

# On a GPU/TPU machine: every notebook on the accelerator, outputs not compared. JOBS=4 runs four
# at once on one GPU (a short loan of a machine); FULL=1 trains 01 whole; logs in .cache/run_notebooks/.
test-accelerator: $(STAMP)
	@JOBS=$(or $(JOBS),1) FULL=$(FULL) $(BIN)/python tools/run_notebooks.py accelerator $(NB)

# Every notebook whole (no caps) on 1, 2 and 4 devices: for a maintainer, not CI.
test-devices: $(STAMP)
	for n in 1 2 4; do CPU_DEVICES=$$n COURSE_TPU_COMPILE=0 $(OFFLINE) $(BIN)/python -m pytest notebooks $(if $(NB),-k $(NB)) || exit 1; done

# The newest release of every package in requirements.txt (no pins, no constraints) in its own
# .venv-latest; every notebook under nbval on 8 devices, one line each. Not part of `make test`
# or CI: it tells a maintainer that a new release broke the course. It never changes the pins.
LATEST := .venv-latest
test-latest:
	@test -n "$(PYTHON)" || { echo "make test-latest: no Python >= 3.12 found; run make PYTHON=/path/to/python3.12 test-latest"; exit 1; }
	test -x $(LATEST)/bin/python || $(PYTHON) -m venv $(LATEST)
	$(LATEST)/bin/python -m pip install --quiet --upgrade pip
	grep -v '^[[:space:]]*#' requirements.txt | sed -E 's/[[:space:]]*(==|>=|<=|~=|!=|<|>|;).*//' | grep -v '^$$' > $(LATEST)/requirements-unpinned.txt
	$(LATEST)/bin/python -m pip install --quiet --upgrade --upgrade-strategy eager -r $(LATEST)/requirements-unpinned.txt
	$(LATEST)/bin/python tests/latest.py $(ARGS)

# The notebooks' copies of course/*.py first (tools/course_cells.py), then the pairs, then the
# folds' metadata that jupytext does not carry over from the .md (tools/execute.py --fold).
sync: $(STAMP)
	$(BIN)/python tools/course_cells.py
	$(BIN)/jupytext --sync md/*.md
	$(BIN)/python tools/execute.py --fold

lint: $(STAMP)
	$(BIN)/ruff check .

# The site shows the committed outputs (no execution). A full build (-E) every time, so that
# every warning shows; warnings are errors. tests/test_docs.py runs the same command.
docs: $(STAMP)
	@start=$$(date +%s); \
	$(BIN)/python -m sphinx -b html -c docs -W --keep-going -n -E -q . _build/html || { \
	  echo "make docs: the warnings above are errors; fix them in md/NAME.md, then make run NB=NAME"; \
	  exit 1; }; \
	echo "make docs: built in $$(( $$(date +%s) - start )) s; open _build/html/index.html"

# Speed is checked by this benchmark, never by timed tests. Prints a table and writes it to
# bench/results/latest.{md,json}. NBVAL=0 skips running every notebook under nbval (~10 min).
bench: $(STAMP)
	$(OFFLINE) $(BIN)/python -m bench $(if $(filter 0 no false,$(NBVAL)),--no-nbval) $(ARGS)

# After a change to requirements.txt: a clean environment from the new pins alone, frozen.
constraints:
	rm -rf $(VENV) && $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -r requirements.txt
	{ sed -n '1,3p' constraints.txt; $(BIN)/pip freeze | grep -v '^-e'; } > constraints.tmp && mv constraints.tmp constraints.txt
	touch $(STAMP)

clean:
	rm -rf .cache _build
