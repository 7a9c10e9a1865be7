# Two commands do everything on a fresh clone: `make run` and `make test`.
# Every target creates .venv and installs the pinned requirements when they are missing.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
NB     ?=

.PHONY: help run test test-devices lint sync data clean docs bench constraints

help:
	@echo "make run           execute every notebook in place (NB=01_minigpt for one)"
	@echo "make test          the whole test suite: notebooks under nbval on 8 CPU devices, pairs, hygiene, lint"
	@echo "make test-devices  execute every notebook at 1, 2 and 4 emulated devices"
	@echo "make sync          jupytext: bring md/ and notebooks/ in line (newest side wins)"
	@echo "make lint          ruff over notebooks and code"
	@echo "make data          write the offline tokenizer cache and corpus under .cache/"
	@echo "make bench         speed vs the seed baselines and the hardware (NBVAL=0 skips the notebooks' wall times)"
	@echo "make docs          build the documentation site from the committed notebooks into _build/html"
	@echo "make constraints   after editing requirements.txt: reinstall from it and freeze constraints.txt"

$(STAMP): requirements.txt constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { \
	  echo "make: the pinned stack (jax 0.10.2) needs Python >= 3.11; $(PYTHON) is $$($(PYTHON) -V 2>&1)."; \
	  echo "      Run e.g. make PYTHON=python3.11 $(MAKECMDGOALS)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt -c constraints.txt
	touch $@

data: $(STAMP)
	$(BIN)/python tools/offline.py

run: $(STAMP)
	$(BIN)/python tools/execute.py $(NB)

# pytest exits 5 when it collected no test: say so plainly instead of failing obscurely.
test: $(STAMP)
	$(BIN)/python -m pytest $(ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests"; exit 0; fi; exit $$rc

test-devices: $(STAMP)
	for n in 1 2 4; do CPU_DEVICES=$$n $(BIN)/python -m pytest notebooks $(if $(NB),-k $(NB)) || exit 1; done

sync: $(STAMP)
	$(BIN)/jupytext --sync md/*.md

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
	$(BIN)/python -m bench $(if $(filter 0 no false,$(NBVAL)),--no-nbval) $(ARGS)

# After a change to requirements.txt: a clean environment from the new pins alone, frozen.
constraints:
	rm -rf $(VENV) && $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -r requirements.txt
	{ sed -n '1,3p' constraints.txt; $(BIN)/pip freeze | grep -v '^-e'; } > constraints.tmp && mv constraints.tmp constraints.txt
	touch $(STAMP)

clean:
	rm -rf .cache _build
