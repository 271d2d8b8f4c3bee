# Two commands do all set-up (README.md):  `make run`  and  `make test`. Both are idempotent.
PYTHON ?= python3.11
VENV   ?= .venv
CORES  ?= all
BIN    := $(CURDIR)/$(VENV)/bin
STAMP  := $(VENV)/.installed
# faiss: the `cpu` extra (faiss-cpu) or `make run FAISS=gpu` (faiss-gpu-cu12, GPU k-means), never both (pyproject.toml)
FAISS  ?= cpu
FAISS_OTHER := $(if $(filter gpu,$(FAISS)),faiss-cpu,faiss-gpu-cu12)

.PHONY: run pull checkout test test-unit test-integration test-e2e lint dry-run clean-results docs-figure

# Create the virtual environment and install the package with its faiss (re-done when pyproject.toml or FAISS
# changes; the other faiss is uninstalled first, as both write one `faiss` package folder).
$(STAMP): pyproject.toml $(VENV)/.faiss-$(FAISS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -qq --upgrade pip
	$(BIN)/python -m pip uninstall -qq -y $(FAISS_OTHER)
	$(BIN)/python -m pip install -qq -e '.[$(FAISS)]'  # -qq: errors only (the local index warns per package)
	touch $(STAMP)

# The faiss extra the environment holds: a new FAISS value makes $(STAMP) reinstall.
$(VENV)/.faiss-$(FAISS):
	mkdir -p $(VENV)
	rm -f $(VENV)/.faiss-*
	touch $@

# The main job: the whole Snakemake DAG on the offline default (prepare, teacher, train, evaluate, report), then
# the HTML report of every table and figure (results/report.html; rebuilt only when the tables changed).
# On success the Snakefile's `onsuccess` records every output in dvc.lock (`dvc commit`): commit dvc.lock,
# `dvc push` to share data and results.
# The train, evaluate and collect jobs start as forks of one process that imported torch, open_clip and MLflow once
# (`protoclip forkserver`, src/protoclip/jobs/forkserver.py): the same results, seconds less per job.
# `make run FORKSERVER=` starts every job as a fresh process.
# --max-jobs-per-timespan: Snakemake 9's scheduler wakes itself once per timespan for every job that finished while
# others waited for cores (its rate limiter's timers), each wake re-reading every ready job's inputs: at the default
# 100/1s, 13-20 % of a core late in this DAG. 1000/10s keeps the average rate and wakes a tenth as often; Snakemake
# waits up to one timespan for its last timer at exit (bench/bench_snakemake_reevaluation.py).
FORKSERVER ?= protoclip forkserver --
SCHEDULER_WAKES ?= --max-jobs-per-timespan 1000/10s
run: $(STAMP)
	PATH=$(BIN):$$PATH $(FORKSERVER) snakemake --cores $(CORES) --resources gpu=0 --rerun-incomplete $(SCHEDULER_WAKES)
	test results/report.html -nt results/tables/index.md || PATH=$(BIN):$$PATH snakemake --report results/report.html

# After a fresh clone (or `git checkout` of another commit): data and results from the DVC remote / cache,
# then Snakemake's file times and metadata set to match (docs/dvc.md), so `make run` reruns
# nothing. Refuses when the outputs do not match dvc.lock (then `make run` recomputes what changed).
pull: $(STAMP)
	PATH=$(BIN):$$PATH dvc pull
	$(MAKE) checkout

checkout: $(STAMP)
	PATH=$(BIN):$$PATH dvc checkout
	PATH=$(BIN):$$PATH dvc status --quiet || { echo "outputs differ from dvc.lock: run 'make run'"; exit 1; }
	PATH=$(BIN):$$PATH snakemake --touch --forceall --cores 1 --quiet

# The tests (what CI runs through .ci/run), with what they start: pytest, the SLURM plugin, the MLflow tracking
# server's packages, PyAV and CLIP_benchmark (pip extras `test`, `slurm`, `tracking-server`, `ucf101`, `prompts`)
# and, as root, the Debian packages of the test SLURM cluster and of PostgreSQL (.ci/install-slurm,
# .ci/install-postgresql; each step does nothing when done).
# Every tier, fastest first (docs/tests.md): `make test-unit`, `make test-integration`, `make test-e2e` run one.
# The unit and integration tiers run on TEST_WORKERS processes (pytest-xdist; one thread each). The end-to-end
# tests spend about a third of their time waiting (process start-ups, SLURM's scheduling and status checks,
# servers), so E2E_WORKERS of them share the 2 cores; those of one SLURM cluster or tracking server run in one
# group (--dist loadgroup, tests/conftest.py), and the slowest are listed at the end (--durations). Both commands
# run, and either failing fails the target.
TEST_WORKERS ?= 2
E2E_WORKERS ?= 3
E2E_ARGS = -n $(E2E_WORKERS) --dist loadgroup --durations=15
test: $(VENV)/.installed-test-extras
	.ci/install-slurm
	.ci/install-postgresql
	status=0; \
	PATH=$(BIN):$$PATH $(BIN)/python -m pytest -q -n $(TEST_WORKERS) tests/unit tests/integration || status=$$?; \
	PATH=$(BIN):$$PATH $(BIN)/python -m pytest -q $(E2E_ARGS) tests/e2e || status=$$?; \
	exit $$status

test-unit test-integration: $(VENV)/.installed-test-extras
	PATH=$(BIN):$$PATH $(BIN)/python -m pytest -q -n $(TEST_WORKERS) tests/$(@:test-%=%)

test-e2e: $(VENV)/.installed-test-extras
	.ci/install-slurm
	.ci/install-postgresql
	PATH=$(BIN):$$PATH $(BIN)/python -m pytest -q $(E2E_ARGS) tests/e2e

$(VENV)/.installed-test-extras: $(STAMP)
	$(BIN)/python -m pip install -qq -e '.[$(FAISS),slurm,tracking-server,ucf101,prompts,test]'
	touch $@

lint: $(STAMP)
	PATH=$(BIN):$$PATH snakemake --lint
	PATH=$(BIN):$$PATH snakemake -n --cores 1 --quiet

# The README's figure in git (results/ is DVC's, so a browsed repository would show a broken image): the Figure 8
# analog of the last `make run`, at most 1280 px wide. Commit docs/img/fig_8.png and say in README.md which run it is.
docs-figure: results/figures/fig_8.png
	$(BIN)/python -c "from PIL import Image; im = Image.open('$<'); im.thumbnail((1280, 1280)); \
	im.save('docs/img/fig_8.png', optimize=True)"

clean-results:
	rm -rf results/runs results/tables results/figures results/mlflow.db logs benchmarks
