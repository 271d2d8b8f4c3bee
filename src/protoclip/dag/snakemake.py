"""Snakemake glue: the config every rule's command reads, and the rules' outputs from the stage graph.

``workflow/rules/common.smk`` calls :func:`resolve_config` once (Snakemake's merged ``config`` -> the file the
commands read) and builds each rule's ``output:`` with :func:`outputs` / :func:`report_outputs` from the
stages of :mod:`protoclip.dag.stages` (the same files dvc.yaml holds).
"""
from __future__ import annotations

import os
from pathlib import Path

from protoclip.dag.stages import Out
from protoclip.layout import Layout
from protoclip.schema import read_yaml


def outputs(targets: dict[str, Out], directory) -> dict:
    """Snakemake outputs from a stage's targets: folders wrapped in Snakemake's ``directory()``."""
    return {name: directory(o.path) if o.directory else o.path for name, o in targets.items()}


def report_outputs(cfg, report) -> dict:
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
    return out


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
