"""The stage graph as data: the one source of truth for the Snakemake rules and for dvc.yaml.

Every stage instance is a :class:`Stage` (command, deps, DVC params, outputs); ``workflow/rules/*.smk`` take their
inputs, outputs and commands from here and ``protoclip dvc-yaml`` writes ``dvc.yaml`` from :func:`stages` (run it
after changing runs or data sets), so both runners run identical commands on identical files.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from protoclip.config.architectures import LOCAL_DIR
from protoclip.project import ProjectConfig
from protoclip.evaluate.config import EvaluateConfig
from protoclip.evaluate.datasets import HELDOUT, eval_data_path, missing_reason
from protoclip.files.layout import Layout
from protoclip.config.strict import read_yaml
from protoclip.dag.code_version import FINGERPRINTS
from protoclip.data.corpus.userdata import input_files
from protoclip.registry import method_class
from protoclip.report.dvc_plots import dvc_plots
from protoclip.report.summary_figures import summary_names

# evaluate keys that change no result (not DVC params of the evaluation stages): the sets have their own entries,
# the chunking of a resumable extraction and where DVC stores the features change no number
NOT_RESULTS = ("datasets", "extract_chunk_batches", "track_features")


def stage_command(stage: str, config_file: str, args: str = "") -> str:
    return f"protoclip {stage} --config {config_file}" + (f" {args}" if args else "")


@dataclass
class Out:
    path: str
    cache: bool = True  # False: DVC does not store it (small, or regenerated)
    persist: bool = False  # True: DVC leaves it in place between runs (resumable checkpoints)
    metric: bool = False  # listed under the stage's `metrics:` (dvc metrics show)
    directory: bool = False  # a folder (Snakemake `directory()` when it is a target)


@dataclass
class Stage:
    """One stage instance (``prepare``, ``teacher_<t>``, ``train_<run>`` (none for a ``pretrained`` run),
    ``evaluate_<run>_<set>``, ``collect_<run>``, ``toy_nemd``, ``report``): its command and files for both runners.

    ``outs`` are what DVC caches (whole folders); ``targets`` the Snakemake outputs, each inside an out. Training
    checkpoints, an evaluation's extraction in progress and its feature files are no output: as an uncached DVC
    out they would read "deleted" after every fresh clone, as a Snakemake output they would be deleted before each
    job (features are a DVC out only with ``evaluate.track_features``). The code a stage runs is its command's key
    in ``code-fingerprints.yaml`` (:mod:`protoclip.dag.code_version`), a DVC param of the stage and a param of its
    Snakemake rule: a comment edit reruns nothing, a code edit reruns the stages whose command imports it.
    """

    name: str  # DVC stage name (the Snakemake job's benchmark file is named after it)
    command: str  # the protoclip subcommand (``train``)
    config_file: str  # the file the command reads (dvc.yaml: config/config.yaml)
    args: str  # the arguments after ``--config <file>`` (``--run clip --resume``)
    deps: dict[str, list[str]]  # Snakemake input name -> paths (DVC deps: all of them)
    params: list = field(default_factory=list)  # DVC params entries
    outs: list[Out] = field(default_factory=list)  # DVC outs (and metrics)
    targets: dict[str, Out] = field(default_factory=dict)  # Snakemake outputs by name, each inside an out

    @property
    def cmd(self) -> str:
        """The shell command (dvc.yaml's ``cmd``)."""
        return stage_command(self.command, self.config_file, self.args)

    @property
    def benchmark(self) -> str:
        """Snakemake's benchmark file of the job (the rules' ``benchmark:`` pattern gives this name)."""
        return f"benchmarks/{self.name}.tsv"

    def inputs(self) -> dict[str, list[str]]:
        """Snakemake ``input:`` (for ``unpack``)."""
        return {k: v for k, v in self.deps.items() if v}

    def dvc(self) -> dict:
        deps = sorted({p for paths in self.deps.values() for p in paths})
        entry: dict = {"cmd": self.cmd}
        if deps:
            entry["deps"] = deps
        # the code the command runs: its fingerprint (comments and docstrings left out), as the Snakemake rule's
        entry["params"] = self.params + [{FINGERPRINTS: [self.command]}]
        outs = [_dvc_out(o) for o in self.outs if not o.metric]
        metrics = [_dvc_out(o) for o in self.outs if o.metric]
        if outs:
            entry["outs"] = outs
        if metrics:
            entry["metrics"] = metrics
        return entry


def _dvc_out(o: Out):
    flags = {k: v for k, v in (("cache", o.cache), ("persist", o.persist)) if v != Out.__dataclass_fields__[k].default}
    return {o.path: flags} if flags else o.path


def norm_path(p) -> str:
    """A path as the string Snakemake and dvc.yaml use (normalised, OS separators)."""
    return str(Path(p))


def _params(config_file: str, *keys: str) -> list:
    """DVC params entry for the dotted ``keys`` that ``config_file`` sets (DVC reports a key the file does not
    set as changed forever; a default that is not in the file is code, covered by the code fingerprint)."""

    data = read_yaml(config_file)

    def present(key: str) -> bool:
        node = data
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True

    found = [k for k in keys if present(k)]
    return [{config_file: found}] if found else []


# --------------------------------------------------------------------------- which run reads what
def teacher_read_by(cfg: ProjectConfig, run: str) -> str | None:
    """The teacher cache run ``run`` reads (TrainConfig.reads_teacher), or None."""
    rc = cfg.run(run)
    return rc.teacher if rc.reads_teacher() else None


def teachers(cfg: ProjectConfig, skipped: dict[str, str] | None = None) -> list[str]:
    """Every teacher cache some configured run reads (one teacher stage each); not for runs in ``skipped``."""
    return sorted({t for r in cfg.run_names() if r not in (skipped or {}) and (t := teacher_read_by(cfg, r))})


def built_by_prepare(cfg: ProjectConfig, dataset: str) -> bool | None:
    """True: `prepare` writes the set's data (the held-out pairs, the offline sets of ``prepare.eval_sets``);
    False: an offline set without a path that `prepare` does not build; None: the set is read from its path."""
    dcfg = cfg.evaluate.datasets[dataset]
    if dcfg.kind != "offline" or dcfg.path:
        return None
    return dataset == HELDOUT or dataset in cfg.prepare.eval_sets


def eval_inputs(cfg: ProjectConfig, lay: Layout, dataset: str) -> list[str]:
    """The data files an evaluation on ``dataset`` reads: what `prepare` builds for it, or its configured path
    when the data is there (datasets.missing_reason; a set added later changes the stage). Empty: no job."""
    dcfg = cfg.evaluate.datasets[dataset]
    built = built_by_prepare(cfg, dataset)
    if built is None:
        built = missing_reason(dataset, dcfg, lay) is None
    return [norm_path(eval_data_path(dataset, dcfg, lay))] if built else []


def evaluated_sets(cfg: ProjectConfig, lay: Layout) -> list[str]:
    """The configured sets that get an evaluation job: the sets `prepare` builds and each set whose data is
    there (the others are reported skipped by `collect`; one added later gets its own job, and only `collect`
    and the report rerun besides it)."""
    return [name for name in cfg.evaluate.datasets if eval_inputs(cfg, lay, name)]


# --------------------------------------------------------------------------- outputs (wildcard-safe)
# These take names only, so the .smk rules can call them with "{run}" / "{dataset}" wildcards.
def train_outs(lay: Layout, run: str) -> dict[str, Out]:
    return {"model": Out(norm_path(lay.model(run))), "log": Out(norm_path(lay.train_log(run))),
            "config": Out(norm_path(lay.run_config(run)))}


def eval_outs(lay: Layout, run: str, dataset: str) -> dict[str, Out]:
    return {"eval": Out(norm_path(lay.eval_dir(run, dataset)), directory=True)}


def features_out(lay: Layout, run: str, dataset: str) -> Out:
    """The set's feature file as a DVC out (evaluate.track_features only): kept in place between runs (persist,
    the extraction's cache) and no Snakemake target (Snakemake would delete it before each job)."""
    return Out(norm_path(lay.features(run, dataset)), persist=True)


def collect_outs(lay: Layout, run: str) -> dict[str, Out]:
    return {"summary": Out(norm_path(lay.metrics_summary(run)), metric=True)}


def prepare_outs(lay: Layout, cfg: ProjectConfig) -> dict[str, Out]:
    return {key: Out(norm_path(path)) for key, path in lay.prepared_files(cfg.prepare.eval_sets).items()}


def teacher_outs(lay: Layout, teacher_file: str) -> dict[str, Out]:
    """``teacher_file``: the cache's file stem (the rule's ``{teacher}`` wildcard)."""
    return {"features": Out(norm_path(lay.teacher_cache(teacher_file))),
            "meta": Out(norm_path(lay.teacher_cache_meta(teacher_file)))}


# --------------------------------------------------------------------------- stages
# Each builds one stage instance from the config, the file the commands pass (``config_file``) and the config's
# paths (``lay``: :func:`stages` makes it once).
def prepare_stage(cfg: ProjectConfig, lay: Layout, config_file: str) -> Stage:
    targets = prepare_outs(lay, cfg)
    return Stage("prepare", "prepare", config_file, "", {"user_data": user_data_inputs(cfg)},
                 _params(config_file, "prepare"), [Out(norm_path(lay.prepared), directory=True)], targets)


def user_data_inputs(cfg: ProjectConfig) -> list[str]:
    """The user data files `prepare` reads that exist: each CSV/TSV, each shard of a webdataset brace range
    (``/data/cc/{00000..00249}.tar``, expanded as webdataset does), so a shard added or replaced later reruns
    `prepare`. A file whose own name holds braces is left out: Snakemake reads ``{name}`` in an input as a
    wildcard, whatever the escaping (prepare's fingerprint still sees it)."""
    files = [p for u in cfg.prepare.user_data for p in input_files(u)]
    return [norm_path(p) for p in files if "{" not in str(p) and "}" not in str(p) and p.is_file()]


def teacher_stage(cfg: ProjectConfig, lay: Layout, config_file: str, teacher: str) -> Stage:
    outs = teacher_outs(lay, lay.teacher_features(teacher).stem)
    return Stage(f"teacher_{lay.teacher_features(teacher).stem}", "teacher", config_file, f"--name {teacher}",
                 {"manifest": [norm_path(lay.manifest)]},
                 _params(config_file, "teacher"), list(outs.values()), outs)


def _run_params(cfg: ProjectConfig, run: str, config_file: str) -> list:
    """DVC params of a run: the train defaults plus the run's own override block."""
    overrides_file = cfg._runs[run][1]
    key = f"runs.{cfg.run_base(run)}"  # a `seeds:` run is declared once, under its base name
    if Path(overrides_file) == Path(config_file):
        return _params(config_file, "train", key)
    return _params(config_file, "train") + _params(overrides_file, key)


def train_stage(cfg: ProjectConfig, lay: Layout, config_file: str, run: str) -> Stage:
    deps = {"manifest": [norm_path(lay.manifest)]}
    if (t := teacher_read_by(cfg, run)):
        deps["teacher"] = [norm_path(lay.teacher_features(t))]
    outs = train_outs(lay, run)
    # resume: a job killed by the cluster continues from its last complete episode
    return Stage(f"train_{run}", "train", config_file, f"--run {run} --resume", deps,
                 _run_params(cfg, run, config_file), list(outs.values()), outs)


def model_inputs(cfg: ProjectConfig, lay: Layout, run: str) -> list[str]:
    """What an evaluation of ``run`` reads as its model: the train stage's ``model.pt``; for a released checkpoint
    (the run's ``pretrained`` section: no train stage) its ``local-dir:`` folder when it exists (a missing folder
    stops the evaluation job, naming it), nothing for an open_clip tag (fetched into open_clip's cache)."""
    pretrained = cfg.run(run).pretrained
    if not pretrained.enabled:
        return [norm_path(lay.model(run))]

    folder = Path(pretrained.tag[len(LOCAL_DIR):]) if pretrained.tag.startswith(LOCAL_DIR) else None
    return [norm_path(folder)] if folder is not None and folder.is_dir() else []


def trained(cfg: ProjectConfig, run: str) -> bool:
    """Whether ``run`` has a train stage (a released checkpoint, ``pretrained``, has none, nor a train log)."""
    return not cfg.run(run).pretrained.enabled


def pretrained_settings(cfg: ProjectConfig, run: str) -> dict:
    """``{"pretrained": {model, tag}}`` of a released checkpoint's run, for its evaluation jobs' settings digest
    (Snakemake; DVC: the run's params); {} for a trained run, whose ``model.pt`` is the evaluation's input."""
    pretrained = cfg.run(run).pretrained
    return {"pretrained": {"model": pretrained.model, "tag": pretrained.tag}} if pretrained.enabled else {}


def evaluate_stage(cfg: ProjectConfig, lay: Layout, config_file: str, run: str, dataset: str,
                   tasks: list[str] | None = None) -> Stage:
    """One (run, set) evaluation job; ``tasks``: only these (what the run's paper targets show), None = all."""
    outs = eval_outs(lay, run, dataset)
    task_args = "".join(f" --task {t}" for t in tasks or [])
    params = _params(config_file, f"evaluate.datasets.{dataset}",
                     *(f"evaluate.{key}" for key in EvaluateConfig.keys() if key not in NOT_RESULTS))
    if not trained(cfg, run):  # the checkpoint it names is the model: a changed tag reruns the evaluation
        params += _run_params(cfg, run, config_file)
    return Stage(f"evaluate_{run}_{dataset}", "evaluate", config_file, f"--run {run} --dataset {dataset}{task_args}",
                 {"model": model_inputs(cfg, lay, run), "data": eval_inputs(cfg, lay, dataset)},
                 params,
                 list(outs.values()) + ([features_out(lay, run, dataset)] if cfg.evaluate.track_features else []),
                 outs)


def target_outputs(cfg: ProjectConfig, lay: Layout) -> list[Path]:
    """Every file ``protoclip report`` writes for the configured targets and the claims ledger (stable: from the
    declarations)."""
    out = [lay.report_index]
    for t in cfg.paper_targets():
        out += lay.target_files(t.id, t.kind) + [lay.caption(t.id)]
    for name in summary_names(cfg):  # ours vs the paper, Table VI's differences, training curves
        out += [lay.figures / f"{name}.png", lay.caption(name)]
    return out + list(lay.claims_files())  # the claims ledger (protoclip.report.ledger_table), even with no claim


def evaluation_requests(cfg: ProjectConfig) -> dict[str, dict[str, list[str]]]:
    """{run (expanded name): {dataset: sorted tasks}}: what the targets show, so the DAG evaluates only that.

    Only data sets configured under ``evaluate.datasets`` are requested.
    """
    out: dict[str, dict[str, set[str]]] = {}
    for t in cfg.paper_targets():
        req = t.requests()
        for base in t.runs():
            for run in cfg.run_group(base):
                for d, tasks in req.items():
                    if d in cfg.evaluate.datasets:
                        out.setdefault(run, {}).setdefault(d, set()).update(tasks)
    return {r: {d: sorted(ts) for d, ts in sorted(v.items())} for r, v in out.items()}


def evaluations(cfg: ProjectConfig, lay: Layout | None = None) -> dict[str, dict[str, list[str] | None]]:
    """{run: {set: tasks or None (all)}}: the evaluation jobs of the DAG. A run that paper targets show is
    evaluated only on the sets and tasks those targets read (:func:`evaluation_requests`);
    a run no target shows gets every task on every evaluated set. A run a target shows but whose targets read
    no evaluation (a figure drawn from the train log alone) gets none."""
    sets = evaluated_sets(cfg, lay or Layout.from_config(cfg))
    requests = evaluation_requests(cfg)
    shown = {run for t in cfg.paper_targets() for base in t.runs() for run in cfg.run_group(base)}
    out: dict[str, dict[str, list[str] | None]] = {}
    for run in cfg.run_names():
        if run in shown:  # only what its targets read (possibly nothing)
            out[run] = {d: list(tasks) for d, tasks in requests.get(run, {}).items() if d in sets}
        else:
            out[run] = {d: None for d in sets}
    return out


def collect_stage(cfg: ProjectConfig, lay: Layout, config_file: str, run: str, datasets: list[str]) -> Stage:
    """``metrics.json`` of ``run``. Besides its evaluation folders it depends on the prepared data when `prepare`
    builds a configured set: `collect` reports a configured set as "not found" when its data is missing, so it
    must run after `prepare` made it (a run that no target evaluates would otherwise be collected before `prepare`
    finished and list the offline sets as not found). Where `prepare` builds no set (the paper config: every set
    read from its path) it does not wait for it: a released checkpoint's run (``pretrained``) on a clone without
    the corpora is collected without a `prepare` that has nothing to read."""
    outs = collect_outs(lay, run)
    builds_sets = any(built_by_prepare(cfg, d) for d in cfg.evaluate.datasets)
    data = [o.path for o in prepare_outs(lay, cfg).values()] if builds_sets else []
    return Stage(f"collect_{run}", "collect", config_file, f"--run {run}",
                 {"evals": [norm_path(lay.eval_dir(run, d)) for d in datasets], "data": data}, [],
                 list(outs.values()), outs)


def report_stage(cfg: ProjectConfig, lay: Layout, config_file: str, skipped: dict[str, str] | None = None) -> Stage:
    """Every declared paper target (:func:`target_outputs`: tables, figures, captions), from the runs not in
    ``skipped`` (those the report lists as skipped, with the reason)."""
    runs = [r for r in cfg.run_names() if r not in (skipped or {})]
    outs = {f"file{i}": Out(norm_path(p)) for i, p in enumerate(target_outputs(cfg, lay))}
    claim_files = sorted({norm_path(f) for _, f in cfg._claims})  # a margin changed in claims.yaml: a new ledger
    return Stage("report", "report", config_file, "",
                 {"summaries": [norm_path(lay.metrics_summary(r)) for r in runs],
                  "train_logs": [norm_path(lay.train_log(r)) for r in runs if trained(cfg, r)], "claims": claim_files,
                  # the toy stage's table: the ledger judges PAUC's toy claim from it (claims.grid, kind: toy)
                  "toy": [norm_path(lay.toy_files()["csv"])]},
                 _params(config_file, "claims"),
                 [Out(norm_path(lay.tables), directory=True), Out(norm_path(lay.figures), directory=True),
                  Out(norm_path(lay.report_dir), directory=True)], outs)


def toy_stage(cfg: ProjectConfig, lay: Layout, config_file: str) -> Stage:
    """PAUC's NEMD toy experiment (protoclip.toy.pauc_nemd): needs no data, only the `toy` config section."""
    outs = {k: Out(norm_path(p)) for k, p in lay.toy_files().items()}
    return Stage("toy_nemd", "toy-nemd", config_file, "", {},
                 _params(config_file, "toy"), list(outs.values()), outs)


def stages(cfg: ProjectConfig, config_file: str) -> list[Stage]:
    """Every stage instance of the config, in DAG order. A run none of whose training data exists
    (``ProjectConfig.runs_without_data``: a user with part of the paper's corpora) gets no stage."""
    lay = Layout.from_config(cfg)
    skipped = cfg.runs_without_data()
    out = [prepare_stage(cfg, lay, config_file)]
    out += [teacher_stage(cfg, lay, config_file, t) for t in teachers(cfg, skipped)]
    for run, jobs in evaluations(cfg, lay).items():
        if run in skipped:
            continue
        if trained(cfg, run):  # a released checkpoint (``pretrained``) is evaluated as it is: no train stage
            out.append(train_stage(cfg, lay, config_file, run))
        out += [evaluate_stage(cfg, lay, config_file, run, d, tasks) for d, tasks in jobs.items()]
        out.append(collect_stage(cfg, lay, config_file, run, list(jobs)))
    out.append(toy_stage(cfg, lay, config_file))
    out.append(report_stage(cfg, lay, config_file, skipped))
    return out


def dvc_stages(cfg: ProjectConfig, config_file: str) -> dict:
    """The `stages:` mapping of dvc.yaml for this config."""
    return {s.name: s.dvc() for s in stages(cfg, config_file)}


def dvc_yaml_text(cfg: ProjectConfig, config_file: str) -> str:

    header = ("# Generated by `protoclip dvc-yaml --config {cfg}` from the same stages as the Snakemake rules\n"
              "# (protoclip/dag/stages.py). Do not edit by hand; tests/e2e/test_workflow.py checks it is current.\n")
    claims_json = norm_path(Layout.from_config(cfg).claims_files().json)
    doc = {
        "stages": dvc_stages(cfg, config_file),
        # the claims ledger's numbers and verdicts (`dvc metrics show`, `dvc metrics diff`), inside the report
        # stage's results/tables out (a top-level metrics entry may name a file inside a stage's output folder)
        "metrics": [claims_json],
        # training curves, per-target numbers and figures, the ledger's forest plot, written by `protoclip report`
        # (dvc plots show / diff)
        "plots": dvc_plots(cfg),
    }
    body = yaml.safe_dump(doc, sort_keys=False, width=120)
    return header.format(cfg=config_file) + body


def exportable_runs(cfg: ProjectConfig) -> list[str]:
    """The configured runs ``protoclip export`` can write (the DAG's ``export_all`` target exports these), decided
    from each run's config by its method's evaluation spec, as the train stage records it in model.pt."""
    from protoclip.models.export_openclip import export_refusal  # heavy: torch, only when the export runs are listed

    out = []
    for r in cfg.run_names():
        tcfg = cfg.run(r)
        if tcfg.pretrained.enabled:  # no model.pt: its checkpoint is an open_clip model already
            continue
        spec = method_class(tcfg.method).eval_spec(tcfg)
        if export_refusal(r, tcfg.method, spec["similarity"], int(tcfg.class_tokens), tcfg.model) is None:
            out.append(r)
    return out
