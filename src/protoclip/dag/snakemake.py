"""Snakemake glue: the config every rule's command reads, and the rules' outputs from the stage graph.

``workflow/rules/common.smk`` calls :func:`resolve_config` once (Snakemake's merged ``config`` -> the file the
commands read) and builds each rule's ``output:`` with :func:`outputs` / :func:`report_outputs` from the
stages of :mod:`protoclip.dag.stages` (the same files dvc.yaml holds).
"""
from __future__ import annotations

import copy
import os
from pathlib import Path

import yaml

from protoclip.project import ProjectConfig
from protoclip.dag.stages import Out
from protoclip.files.layout import Layout
from protoclip.config.strict import read_yaml
from protoclip.files.atomic import write_text
from protoclip.files.hashing import json_sha256
from protoclip.report.summary_figures import summary_names


def outputs(targets: dict[str, Out], directory) -> dict:
    """Snakemake outputs from a stage's targets: folders wrapped in Snakemake's ``directory()``."""
    return {name: directory(o.path) if o.directory else o.path for name, o in targets.items()}


def report_outputs(cfg: ProjectConfig, report) -> dict:
    """Named outputs of the report rule (the files of :func:`protoclip.dag.stages.report_stage`): per target its
    table (.html) or figure (.png) wrapped in Snakemake's ``report(path, caption=, category=, labels=)``, its
    other files, and its caption file (written by the rule; absolute, as Snakemake joins caption paths to the
    rule file's folder)."""
    lay = Layout.from_config(cfg)
    out: dict = {"index": str(lay.report_index)}
    for t in cfg.paper_targets():
        paths = [str(p) for p in lay.target_files(t.id, t.kind)]
        caption = lay.caption(t.id)
        flag = {"caption": os.path.abspath(caption), "labels": {"target": t.id}}
        if t.kind == "table":
            out[t.id] = report(paths[3], category="Tables", **flag)
            out[f"{t.id}_files"] = paths[:3]
        else:
            out[t.id] = report(paths[0], category="Figures", **flag)
        out[f"{t.id}_caption"] = str(caption)

    for name in summary_names(cfg):  # ours vs the paper, Table VI's differences, training curves: Figures too
        caption = lay.caption(name)
        out[name] = report(str(lay.figures / f"{name}.png"), category="Figures", caption=os.path.abspath(caption),
                           labels={"target": name})
        out[f"{name}_caption"] = str(caption)
    # the claims ledger: its table and forest plot in their own category, captioned with the verdict rule
    files = lay.claims_files()
    flag = {"caption": os.path.abspath(files.rst), "category": "Claims"}
    out["claims"] = report(str(files.html), labels={"target": "claims ledger"}, **flag)
    out["claims_plot"] = report(str(files.png), labels={"target": "claims forest plot"}, **flag)
    out["claims_files"] = [str(p) for p in (files.md, files.csv, files.tex, files.json)]
    out["claims_caption"] = str(files.rst)
    return out


RESOLVED_CONFIG = ".snakemake/protoclip/config.yaml"


# config keys (dotted: nested) that list files relative to the config file that lists them (protoclip.project)
PATH_LIST_KEYS = ("experiments", "targets", "claims.files")


def _get(data: dict, dotted: str):
    """The value at a dotted key of nested mappings, or None."""
    for part in dotted.split("."):
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data


class UntrackedParam:
    """A rule param that reruns nothing: it formats into the shell command as ``text``, and Snakemake records
    (and compares, for its params rerun trigger) only params of builtin types (str, int, list, ...), leaving any
    other object out. The rules pass the config file's name so: a job reruns on its own settings
    (:func:`settings_digest`), not because an override moved the config to another file."""

    def __init__(self, text: str):
        self.text = text

    def __str__(self) -> str:
        return self.text

    def __format__(self, spec: str) -> str:
        return format(self.text, spec)


def skipped_summary(skipped: dict[str, str], n_runs: int) -> str | None:
    """One line on the runs skipped for absent data, grouped by reason (None when none is)."""
    if not skipped:
        return None
    by_reason: dict[str, list[str]] = {}
    for run, why in skipped.items():
        by_reason.setdefault(why, []).append(run)
    parts = [f"{len(runs)} for {why.removeprefix('training data absent ')}" for why, runs in by_reason.items()]
    return (f"{len(skipped)} of {n_runs} runs skipped, their training data is absent: {'; '.join(parts)} "
            f"(listed in the report's index)")


def display_path(path) -> str:
    """``path`` relative to the working directory when it lies inside it (Snakemake makes --configfile paths
    absolute; the commands then read ``config/paper.yaml``, as the user wrote it), else as given."""
    rel = os.path.relpath(os.path.abspath(path))
    return str(path) if rel == ".." or rel.startswith(".." + os.sep) else rel


def repeated_configfile_flag(argv: list[str]) -> str | None:
    """A one-line error when ``argv`` gives ``--configfile`` more than once, else None. Snakemake's option takes
    several files after one flag (``--configfile config/paper.yaml my-site.yaml``) and a second flag replaces
    the first's files: ``--configfile config/paper.yaml --configfile my-site.yaml`` would run my-site.yaml alone."""
    flags = [a for a in argv if a.split("=", 1)[0] in ("--configfile", "--configfiles")]
    if len(flags) < 2:
        return None
    return ("--configfile is given more than once, and Snakemake keeps only the last one's files: list every "
            "config file after one flag, in order (--configfile config/paper.yaml my-site.yaml)")


def settings_digest(section) -> str:
    """sha256 (16 hex digits) of a job's resolved settings as canonical JSON: the rule param that reruns the job
    when, and only when, they change (not the name of the file that holds them)."""
    return json_sha256(section)[:16]


def resolve_config(merged: dict, default_file: str, cli_files: list[str], cli_config: dict,
                   resolved_path: str = RESOLVED_CONFIG) -> str:
    """The config file every rule's command passes to ``protoclip``: Snakemake's own merged ``config``.

    The config is ``default_file`` when no ``--configfile`` is given, else the ``--configfile`` files merged in
    order (the default not under them), then ``--config`` on top (the Snakefile loads it so). When that is one
    file unchanged (``default_file`` alone, or a single ``--configfile``), that file itself is used (the
    commands in dvc.yaml for the default). Otherwise the merged config is written to ``resolved_path`` (rewritten
    only when it changes) and every command reads it, so an override takes effect in every stage, or fails
    validation there with the key named. Relative ``experiments``, ``targets`` and ``claims.files`` entries keep
    meaning "relative to the file that listed them" (rewritten relative to the resolved file; from
    ``--config``: relative to the working directory).
    """
    sources = list(cli_files) or [default_file]
    if len(sources) == 1 and merged == read_yaml(sources[0]):
        return sources[0]
    data = copy.deepcopy(merged)
    out_dir = Path(resolved_path).parent.resolve()
    for key in PATH_LIST_KEYS:
        entries = _get(data, key)
        if not isinstance(entries, list):
            continue
        origin = Path(".")
        if _get(cli_config, key) is None:
            for f in reversed(sources):
                if _get(read_yaml(f) or {}, key) is not None:
                    origin = Path(f).parent
                    break
        *parents, last = key.split(".")
        holder = data
        for part in parents:
            holder = holder[part]
        holder[last] = [e if Path(e).is_absolute() else os.path.relpath((origin / e).resolve(), out_dir)
                        for e in entries]
    text = ("# Written by workflow/rules/common.smk: the project config (config/config.yaml, or the --configfile\n"
            "# files in order) with the command line's --config keys. Every rule's command reads this file.\n"
            + yaml.safe_dump(data, sort_keys=False))
    path = Path(resolved_path)
    if not path.exists() or path.read_text() != text:
        write_text(path, text)
    return resolved_path


def schema_error(err: BaseException, schema_file: str = "workflow/schemas/config.schema.yaml") -> str:
    """One line for a failed ``snakemake.utils.validate`` of the config, naming the key as the loader does
    (``unknown key 'train.lrr' (known keys of 'train': ...)``); Snakemake's own message spans lines and prints
    the whole config section."""
    cause = err
    while cause is not None and not hasattr(cause, "validator"):  # the jsonschema ValidationError it wraps
        cause = cause.__cause__ or cause.__context__
    if cause is None:
        return " ".join(str(err).split())
    while cause.parent is not None and cause.parent.validator == "anyOf":  # a branch of number / integer
        cause = cause.parent
    path = ".".join(str(p) for p in cause.absolute_path)
    schema = cause.schema if isinstance(cause.schema, dict) else {}
    if cause.validator == "additionalProperties" and isinstance(cause.instance, dict):
        known = list(schema.get("properties", {}))
        unknown = sorted(str(k) for k in cause.instance if k not in known)
        key = f"{path}.{unknown[0]}" if path else unknown[0]
        what = f"unknown key '{key}' (known keys of '{path or '<top>'}': {', '.join(known)})"
    elif cause.validator == "anyOf" and schema.get("description"):  # the number / integer definitions
        what = f"'{path}' must be {schema['description'].split(';')[0]}, got {cause.instance!r}"
    else:
        what = f"'{path or '<top>'}': {' '.join(cause.message.split())}"
    return f"{schema_file}: {what}"
