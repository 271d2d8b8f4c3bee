"""The pipeline's stages as data: the one source of truth for the Snakemake rules and for dvc.yaml.

Every stage instance (``prepare``, ``teacher_<t>``, ``train_<run>``, ``evaluate_<run>_<set>``,
``collect_<run>``, ``report``) is a :class:`Stage`: its command, its inputs (``deps``), its DVC params and
its outputs. ``workflow/rules/*.smk`` take each rule's inputs, outputs and shell command from here (input
functions), and ``protoclip dvc-yaml`` writes ``dvc.yaml`` from :func:`stages`, so ``snakemake`` and
``dvc repro`` run identical commands on identical files (checked by tests/test_workflow.py).

    protoclip dvc-yaml --config config/config.yaml     # rewrite dvc.yaml after changing runs or data sets

Outputs: ``outs`` are what DVC caches (directories where a stage writes a folder); ``targets`` are the
Snakemake outputs, each inside one of ``outs`` (Snakemake needs the files other rules read; DVC needs the
whole folder, e.g. ``data/prepared`` with its images). Every out is cached, so ``dvc push`` / ``dvc pull``
carry all of them and a fresh clone is complete. Training checkpoints (``checkpoints/``: last.pt, the MLflow
run id) are no output at all: work-in-progress state left in place for ``--resume``; as a DVC out that is not
cached they would read "deleted" after every fresh clone (dvc status never clean, dvc repro retrains), and as a
Snakemake output they would be deleted before each job. DVC deps include the code (``src/protoclip``) and each
configured external evaluation path that exists.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path

from protoclip.evaluate.config import EvaluateConfig
from protoclip.layout import Layout

CODE = "src/protoclip"  # every stage runs this package: a DVC dep of each stage


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
    name: str  # DVC stage name
    rule: str  # Snakemake rule that runs it
    cmd: str
    deps: dict[str, list[str]]  # Snakemake input name -> paths (DVC deps: all of them, plus CODE)
    params: list = field(default_factory=list)  # DVC params entries
    outs: list[Out] = field(default_factory=list)  # DVC outs (and metrics)
    targets: dict[str, Out] = field(default_factory=dict)  # Snakemake outputs by name, each inside an out

    @property
    def benchmark(self) -> str:
        """Snakemake's benchmark file of the job (the rules' ``benchmark:`` pattern gives this name)."""
        return f"benchmarks/{self.name}.tsv"

    def inputs(self) -> dict[str, list[str]]:
        """Snakemake ``input:`` (for ``unpack``)."""
        return {k: v for k, v in self.deps.items() if v}

    def dvc(self) -> dict:
        deps = sorted({p for paths in self.deps.values() for p in paths} | {CODE})
        entry: dict = {"cmd": self.cmd, "deps": deps}
        if self.params:
            entry["params"] = self.params
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


def _s(p) -> str:
    return str(Path(p))


def _params(config_file: str, *keys: str) -> list:
    """DVC params entry for the dotted ``keys`` that ``config_file`` sets (DVC reports a key the file does not
    set as changed forever; a default that is not in the file is code, covered by the CODE dep)."""
    from protoclip.config import read_yaml

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
def teacher_read_by(cfg, run: str) -> str | None:
    """The teacher cache run ``run`` reads (TrainConfig.reads_teacher), or None."""
    rc = cfg.run(run)
    return rc.teacher if rc.reads_teacher() else None


def teachers(cfg) -> list[str]:
    """Every teacher cache some configured run reads (one teacher stage each)."""
    return sorted({t for r in cfg.run_names() if (t := teacher_read_by(cfg, r))})


def evaluated_sets(cfg) -> list[str]:
    """The configured sets that get an evaluation job: the offline sets `prepare` builds, the held-out pairs,
    and each external set whose path exists (the others are reported skipped by `collect`; one added later
    gets its own job, and only `collect` and the report rerun besides it)."""
    from protoclip.evaluate.datasets import HELDOUT

    out = []
    for name, dcfg in cfg.evaluate.datasets.items():
        if dcfg.kind == "offline" and not dcfg.path:
            if name == HELDOUT or name in cfg.prepare.eval_sets:
                out.append(name)
        elif eval_inputs(cfg, name):
            out.append(name)
    return out


def eval_inputs(cfg, dataset: str) -> list[str]:
    """The data files an evaluation on ``dataset`` reads: the prepared set or the manifest (held-out pairs),
    or the configured external path when it exists (a set added later changes the stage)."""
    from protoclip.evaluate.datasets import HELDOUT

    lay = Layout.from_config(cfg)
    dcfg = cfg.evaluate.datasets[dataset]
    if dcfg.kind == "offline" and not dcfg.path:
        if dataset == HELDOUT:
            return [_s(lay.manifest)]
        return [_s(lay.eval_set(dataset))] if dataset in cfg.prepare.eval_sets else []
    path = Path(dcfg.path).expanduser() if dcfg.path else None
    return [_s(path)] if path is not None and path.exists() else []


# --------------------------------------------------------------------------- outputs (wildcard-safe)
# These take names only, so the .smk rules can call them with "{run}" / "{dataset}" wildcards.
def train_outs(lay: Layout, run: str) -> dict[str, Out]:
    return {"model": Out(_s(lay.model(run))), "log": Out(_s(lay.train_log(run))),
            "config": Out(_s(lay.run_dir(run) / "config.yaml"))}


def eval_outs(lay: Layout, run: str, dataset: str) -> dict[str, Out]:
    return {"eval": Out(_s(lay.eval_dir(run, dataset)), directory=True)}


def collect_outs(lay: Layout, run: str) -> dict[str, Out]:
    return {"summary": Out(_s(lay.metrics_summary(run)), metric=True)}


def prepare_outs(lay: Layout, cfg) -> dict[str, Out]:
    return {key: Out(_s(path)) for key, path in lay.prepared_files(cfg.prepare.eval_sets).items()}


def teacher_outs(lay: Layout, teacher_file: str) -> dict[str, Out]:
    base = lay.data_dir / "teacher" / teacher_file
    return {"features": Out(_s(base.with_suffix(".npz"))), "meta": Out(_s(base.with_suffix(".json")))}


# --------------------------------------------------------------------------- stages
def prepare_stage(cfg, config_file: str) -> Stage:
    lay = Layout.from_config(cfg)
    targets = prepare_outs(lay, cfg)
    user = [_s(Path(u.path)) for u in cfg.prepare.user_data if "{" not in str(u.path) and Path(u.path).exists()]
    return Stage("prepare", "prepare", stage_command("prepare", config_file), {"user_data": user},
                 _params(config_file, "prepare"), [Out(_s(lay.prepared), directory=True)], targets)


def teacher_stage(cfg, config_file: str, teacher: str) -> Stage:
    lay = Layout.from_config(cfg)
    outs = teacher_outs(lay, lay.teacher_features(teacher).stem)
    return Stage(f"teacher_{lay.teacher_features(teacher).stem}", "teacher",
                 stage_command("teacher", config_file, f"--name {teacher}"), {"manifest": [_s(lay.manifest)]},
                 _params(config_file, "teacher"), list(outs.values()), outs)


def _run_params(cfg, run: str, config_file: str) -> list:
    """DVC params of a run: the train defaults plus the run's own override block."""
    overrides_file = cfg._runs[run][1]
    key = f"runs.{cfg.run_base(run)}"  # a `seeds:` run is declared once, under its base name
    if Path(overrides_file) == Path(config_file):
        return _params(config_file, "train", key)
    return _params(config_file, "train") + _params(overrides_file, key)


def train_stage(cfg, config_file: str, run: str) -> Stage:
    lay = Layout.from_config(cfg)
    deps = {"manifest": [_s(lay.manifest)]}
    if (t := teacher_read_by(cfg, run)):
        deps["teacher"] = [_s(lay.teacher_features(t))]
    outs = train_outs(lay, run)
    # resume: a job killed by the cluster continues from its last complete episode
    return Stage(f"train_{run}", "train", stage_command("train", config_file, f"--run {run} --resume"), deps,
                 _run_params(cfg, run, config_file), list(outs.values()), outs)


def evaluate_stage(cfg, config_file: str, run: str, dataset: str, tasks: list[str] | None = None) -> Stage:
    """One (run, set) evaluation job; ``tasks``: only these (what the run's paper targets show), None = all."""
    lay = Layout.from_config(cfg)
    outs = eval_outs(lay, run, dataset)
    task_args = "".join(f" --task {t}" for t in tasks or [])
    return Stage(f"evaluate_{run}_{dataset}", "evaluate",
                 stage_command("evaluate", config_file, f"--run {run} --dataset {dataset}{task_args}"),
                 {"model": [_s(lay.model(run))], "data": eval_inputs(cfg, dataset)},
                 _params(config_file, f"evaluate.datasets.{dataset}",
                         *(f"evaluate.{f.name}" for f in fields(EvaluateConfig) if f.name != "datasets")),
                 list(outs.values()), outs)


def evaluations(cfg) -> dict[str, dict[str, list[str] | None]]:
    """{run: {set: tasks or None (all)}}: the evaluation jobs of the DAG. A run that paper targets show is
    evaluated only on the sets and tasks those targets read (protoclip.report.targets.evaluation_requests);
    a run no target shows gets every task on every evaluated set. A run a target shows but whose targets read
    no evaluation (a temperature-study figure) gets none."""
    from protoclip.report.targets import evaluation_requests, targets

    sets = evaluated_sets(cfg)
    requests = evaluation_requests(cfg)
    shown = {run for t in targets(cfg) for base in t.runs() for run in cfg.run_group(base)}
    out: dict[str, dict[str, list[str] | None]] = {}
    for run in cfg.run_names():
        if run in shown:  # e.g. a temperature-study run: its figure reads the train log only
            out[run] = {d: list(tasks) for d, tasks in requests.get(run, {}).items() if d in sets}
        else:
            out[run] = {d: None for d in sets}
    return out


def collect_stage(cfg, config_file: str, run: str, datasets: list[str]) -> Stage:
    """``metrics.json`` of ``run``. Besides its evaluation folders it depends on the prepared data: `collect`
    reports a configured set as "not found" when its data is missing, so it must run after `prepare` made it
    (a run that no target evaluates, e.g. the temperature runs, would otherwise be collected before `prepare`
    finished and list the offline sets as not found)."""
    lay = Layout.from_config(cfg)
    outs = collect_outs(lay, run)
    data = [o.path for o in prepare_outs(lay, cfg).values()]
    return Stage(f"collect_{run}", "collect", stage_command("collect", config_file, f"--run {run}"),
                 {"evals": [_s(lay.eval_dir(run, d)) for d in datasets], "data": data}, [],
                 list(outs.values()), outs)


def report_stage(cfg, config_file: str) -> Stage:
    """Every declared paper target (protoclip.report.targets.target_outputs: tables, figures, captions)."""
    from protoclip.report.targets import target_outputs

    lay = Layout.from_config(cfg)
    runs = cfg.run_names()
    outs = {f"file{i}": Out(_s(p)) for i, p in enumerate(target_outputs(cfg))}
    return Stage("report", "report", stage_command("report", config_file),
                 {"summaries": [_s(lay.metrics_summary(r)) for r in runs],
                  "train_logs": [_s(lay.train_log(r)) for r in runs]}, [],
                 [Out(_s(lay.tables), directory=True), Out(_s(lay.figures), directory=True),
                  Out(_s(lay.results_dir / "report"), directory=True)], outs)  # report/: target captions


def toy_stage(cfg, config_file: str) -> Stage:
    """PAUC's NEMD toy experiment (protoclip.toy.pauc_nemd): needs no data, only the `toy` config section."""
    from protoclip.toy.pauc_nemd import toy_outputs

    outs = {k: Out(_s(p)) for k, p in toy_outputs(Layout.from_config(cfg)).items()}
    return Stage("toy_nemd", "toy_nemd", stage_command("toy-nemd", config_file), {},
                 _params(config_file, "toy"), list(outs.values()), outs)


def stages(cfg, config_file: str) -> list[Stage]:
    """Every stage instance of the config, in DAG order."""
    out = [prepare_stage(cfg, config_file)]
    out += [teacher_stage(cfg, config_file, t) for t in teachers(cfg)]
    for run, jobs in evaluations(cfg).items():
        out.append(train_stage(cfg, config_file, run))
        out += [evaluate_stage(cfg, config_file, run, d, tasks) for d, tasks in jobs.items()]
        out.append(collect_stage(cfg, config_file, run, list(jobs)))
    out.append(toy_stage(cfg, config_file))
    out.append(report_stage(cfg, config_file))
    return out


def dvc_stages(cfg, config_file: str) -> dict:
    """The `stages:` mapping of dvc.yaml for this config."""
    return {s.name: s.dvc() for s in stages(cfg, config_file)}


def dvc_yaml_text(cfg, config_file: str) -> str:
    import yaml

    from protoclip.report.dvc_plots import dvc_plots

    header = ("# Generated by `protoclip dvc-yaml --config {cfg}` from the same stages as the Snakemake rules\n"
              "# (protoclip/pipeline.py). Do not edit by hand; tests/test_workflow.py checks it is current.\n")
    doc = {
        "stages": dvc_stages(cfg, config_file),
        # training curves, per-target numbers and figures, written by `protoclip report` (dvc plots show / diff)
        "plots": dvc_plots(cfg),
    }
    body = yaml.safe_dump(doc, sort_keys=False, width=120)
    return header.format(cfg=config_file) + body


# --------------------------------------------------------------------------- DVC records what Snakemake made
def dvc_commit(cfg, config_file: str, default_config: str, made: set[str] | None = None,
               dvc_yaml: str = "dvc.yaml", lock: str = "dvc.lock") -> list[str]:
    """``dvc commit --force`` the stages whose Snakemake jobs this run executed (``made``: the output paths of
    those jobs; None: every stage whose outputs exist), plus any stage that dvc.lock does not record yet (and the
    stages downstream of it), then put their file times back in DAG order.

    Called by the Snakefile's ``onsuccess:`` handler, so that after ``snakemake`` dvc.lock records every output
    (``dvc status`` clean, ``dvc repro`` does nothing, ``dvc push`` uploads them). Stages that did not run keep
    their lock entries and file times: an incremental run that changed one evaluation commits that job, its
    collect and the report, not the whole DAG (rehashing and restamping every output took minutes). Skipped, with
    a message, when the commands read overridden config (dvc.yaml describes ``default_config``), when the folder
    is not a DVC repository, or when dvc.yaml is stale (``protoclip dvc-yaml`` rewrites it).
    """
    import subprocess
    import sys

    if not Path(".dvc").is_dir() or not Path(dvc_yaml).is_file():
        return []
    if config_file != default_config:
        print(f"protoclip: config overrides in effect: dvc.lock not updated ({dvc_yaml} describes {default_config})",
              file=sys.stderr)
        return []
    if Path(dvc_yaml).read_text() != dvc_yaml_text(cfg, config_file):
        print(f"protoclip: {dvc_yaml} is stale, dvc.lock not updated: run `protoclip dvc-yaml --config "
              f"{config_file}` and commit it", file=sys.stderr)
        return []
    stage_list = stages(cfg, config_file)
    names = stages_to_commit(stage_list, made, locked_stages(lock))
    if names:
        subprocess.run([sys.executable, "-c", "import sys; from protoclip.pipeline import dvc_commit_stages; "
                        "dvc_commit_stages(sys.argv[1:])", *names], check=True)
        print(f"protoclip: dvc.lock records {len(names)} stage(s) this run made or dvc.lock lacked", file=sys.stderr)
        # `dvc commit` moves each changed output into its cache and copies it back with a new file time, in its
        # own order: put the times back in DAG order, or Snakemake (which always reruns a job whose input is
        # newer than its output, whatever --rerun-triggers says) would rerun the next stages
        restamp([st for st in stage_list if st.name in names])
    return names


def dvc_commit_stages(names: list[str]) -> None:
    """``dvc commit --force <names>`` in one pass over dvc.yaml / dvc.lock (dvc 3.67, pinned).

    The CLI commits target by target, and each target re-reads dvc.yaml and rewrites dvc.lock (ruamel YAML): ~1.2 s
    a stage with this project's 190 stages, 4 minutes after a full ``make run``. This is DVC's own
    ``dvc.repo.commit.commit`` loop (``stage.save()``, ``stage.commit()``, one ``dump_stages`` per file) over stages
    loaded once from the repo index, without writing DVC's run cache (``.dvc/cache/runs``, a memo that lets
    ``dvc repro`` restore outputs of a stage run before; nothing here reads it, and it cost 0.17 s a stage);
    tests/test_dvc_roundtrip.py checks that ``dvc status`` is clean after it.
    """
    from itertools import groupby

    from dvc.repo import Repo, lock_repo

    wanted = set(names)
    with Repo() as repo, lock_repo(repo):
        found = [st for st in repo.index.stages if getattr(st, "name", None) in wanted]
        missing = wanted - {st.name for st in found}
        if missing:
            raise ValueError(f"dvc.yaml has no stage(s) {sorted(missing)}")
        for dvcfile, group in groupby(found, key=lambda st: st.dvcfile):
            group = list(group)
            for st in group:
                st.save(run_cache=False)
                st.commit(relink=True)
            dvcfile.dump_stages(group, update_pipeline=False)


def locked_stages(lock: str | Path = "dvc.lock") -> set[str]:
    """The stage names dvc.lock records (empty when there is none)."""
    import yaml

    path = Path(lock)
    if not path.is_file():
        return set()
    return set((yaml.safe_load(path.read_text()) or {}).get("stages", {}) or {})


def stages_to_commit(stage_list: list[Stage], made: set[str] | None, locked: set[str]) -> list[str]:
    """Names, in DAG order, of the stages to ``dvc commit``: those whose Snakemake targets are all in ``made`` (the
    jobs that ran; None: all), those dvc.lock lacks, and every stage downstream of those two kinds, each only when
    its outputs and inputs exist (a set whose data is missing has no output to record). The downstream closure
    keeps file times in DAG order after :func:`restamp` (Snakemake reruns downstream jobs itself, so it adds
    nothing after a normal run; it matters for a stage committed only because the lock lacked it)."""
    def exists(st: Stage) -> bool:
        return all(Path(o.path).exists() for o in st.outs) and all(Path(p).exists() for ps in st.deps.values() for p in ps)

    def ran(st: Stage) -> bool:
        return made is None or all(_s(t.path) in made for t in st.targets.values())

    chosen: set[str] = set()
    out_paths: dict[str, list[str]] = {st.name: [_s(o.path) for o in st.outs] for st in stage_list}
    for st in stage_list:  # stage_list is in DAG order: a stage's producers come before it
        deps = [_s(p) for ps in st.deps.values() for p in ps]
        upstream = any(dep == out or dep.startswith(out + os.sep)
                       for name in chosen for out in out_paths[name] for dep in deps)
        if (ran(st) or st.name not in locked or upstream) and exists(st):
            chosen.add(st.name)
    return [st.name for st in stage_list if st.name in chosen]


def restamp(stage_list: list[Stage]) -> None:
    """Set the file times of the stages' Snakemake targets in DAG order (each stage's newer than the last's)."""
    import time

    now = time.time()
    for i, st in enumerate(stage_list):
        t = now - (len(stage_list) - i) * 0.01
        # Snakemake counts a job's benchmark file among its outputs' times (workflow/rules: benchmarks/<stage>.tsv)
        for p in [Path(o.path) for o in st.targets.values()] + [Path(st.benchmark)]:
            files = [p] + (sorted(p.rglob("*")) if p.is_dir() else [])
            for f in files:
                if f.exists():
                    os.utime(f, (t, t))


# --------------------------------------------------------------------------- config overrides
RESOLVED_CONFIG = ".snakemake/protoclip/config.yaml"


# config keys that list files relative to the config file that lists them (protoclip.config.load_config)
PATH_LIST_KEYS = ("experiments", "targets")


def resolve_config(merged: dict, default_file: str, cli_files: list[str], cli_config: dict,
                   resolved_path: str = RESOLVED_CONFIG) -> str:
    """The config file every rule's command passes to ``protoclip``: Snakemake's own merged ``config``.

    Snakemake merges the Snakefile's ``configfile`` with each ``--configfile`` and then ``--config``. When that
    adds nothing to ``default_file``, the default file itself is used (the commands in dvc.yaml). Otherwise the
    merged config is written to ``resolved_path`` (rewritten only when it changes) and every command reads it,
    so an override takes effect in every stage, or fails validation there with the key named. Relative
    ``experiments`` and ``targets`` entries keep meaning "relative to the file that listed them" (rewritten relative to the
    resolved file; from ``--config``: relative to the working directory).
    """
    import yaml

    from protoclip.config import read_yaml

    base = read_yaml(default_file)
    if merged == base:
        return default_file
    data = dict(merged)
    out_dir = Path(resolved_path).parent.resolve()
    for key in PATH_LIST_KEYS:
        if key not in data:
            continue
        origin = Path(default_file).parent
        if key in cli_config:
            origin = Path(".")
        else:
            for f in reversed(cli_files):
                if key in (read_yaml(f) or {}):
                    origin = Path(f).parent
                    break
        data[key] = [e if Path(e).is_absolute() else os.path.relpath((origin / e).resolve(), out_dir)
                     for e in data[key]]
    text = ("# Written by workflow/rules/common.smk: the project config merged with the command line's\n"
            "# --configfile / --config overrides. Every rule's command reads this file.\n"
            + yaml.safe_dump(data, sort_keys=False))
    path = Path(resolved_path)
    if not path.exists() or path.read_text() != text:
        from protoclip.atomic import write_text

        write_text(path, text)
    return resolved_path
