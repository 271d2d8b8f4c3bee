# Two commands do all set-up (README.md):  `make run`  and  `make test`. Both are idempotent.
PYTHON ?= python3.11
VENV   ?= .venv
CORES  ?= all
BIN    := $(CURDIR)/$(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test lint dry-run clean-results

# Create the virtual environment and install the package (re-done only when pyproject.toml changes).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -qq --upgrade pip
	$(BIN)/python -m pip install -qq -e .  # -qq: errors only (the local wheel index prints a warning per package)
	touch $(STAMP)

# The main job: the whole Snakemake DAG on the offline default (prepare, teacher, train, evaluate, report).
run: $(STAMP)
	PATH=$(BIN):$$PATH snakemake --cores $(CORES) --resources gpu=0 --rerun-incomplete

# The tests (what CI runs through .ci/run).
test: $(STAMP)
	PATH=$(BIN):$$PATH $(BIN)/python -m pytest -q

lint: $(STAMP)
	PATH=$(BIN):$$PATH snakemake --lint
	PATH=$(BIN):$$PATH snakemake -n --cores 1 --quiet

clean-results:
	rm -rf results/runs results/tables results/figures results/mlflow.db logs benchmarks
