"""DVC records what Snakemake made: ``dvc commit`` of the stages a ``snakemake`` invocation ran.

Called by the Snakefile's ``onsuccess:`` handler (:func:`dvc_commit`), so that after ``snakemake`` dvc.lock
records every output (``dvc status`` clean, ``dvc repro`` does nothing, ``dvc push`` uploads them). The
stages are :func:`protoclip.dag.stages.stages`; the file times are put back in DAG order afterwards
(:mod:`protoclip.dag.filetimes`).
"""
from __future__ import annotations

import os
import subprocess
import sys
from itertools import groupby
from pathlib import Path

import yaml

from protoclip.project import ProjectConfig
from protoclip.dag.filetimes import restamp
from protoclip.dag.stages import Stage, dvc_yaml_text, norm_path, stages


def dvc_commit(cfg: ProjectConfig, config_file: str, default_config: str, made: set[str] | None = None,
               dvc_yaml: str = "dvc.yaml", lock: str = "dvc.lock") -> list[str]:
    """``dvc commit --force`` the stages whose Snakemake jobs this run executed (``made``: the output paths of
    those jobs; None: every stage whose outputs exist), plus any stage that dvc.lock does not record yet (and the
    stages downstream of it), then put their file times back in DAG order.

    Called by the Snakefile's ``onsuccess:`` handler, so that after ``snakemake`` dvc.lock records every output
    (``dvc status`` clean, ``dvc repro`` does nothing, ``dvc push`` uploads them). Stages that did not run keep
    their lock entries and file times: an incremental run that changed one evaluation commits that job, its
    collect and the report, not the whole DAG (rehashing and restamping every output is slow). Skipped, with
    a message, when the commands read overridden config (dvc.yaml describes ``default_config``), when the folder
    is not a DVC repository, or when dvc.yaml is stale (``protoclip dvc-yaml`` rewrites it).
    """
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
        subprocess.run([sys.executable, "-c", "import sys; from protoclip.dag.dvc_sync import dvc_commit_stages; "
                        "dvc_commit_stages(sys.argv[1:])", *names], check=True)
        print(f"protoclip: dvc.lock records {len(names)} stage(s) this run made or dvc.lock lacked", file=sys.stderr)
        # `dvc commit` moves each changed output into its cache and copies it back with a new file time, in its
        # own order: put the times back in DAG order, or Snakemake (which always reruns a job whose input is
        # newer than its output, whatever --rerun-triggers says) would rerun the next stages
        restamp([st for st in stage_list if st.name in names])
    return names


def dvc_commit_stages(names: list[str]) -> None:
    """``dvc commit --force <names>`` in one pass over dvc.yaml / dvc.lock (dvc 3.67, pinned).

    Not the CLI: it commits target by target, re-reading dvc.yaml and rewriting dvc.lock for each, which is slow
    with hundreds of stages. This is DVC's own ``dvc.repo.commit.commit`` loop (``stage.save()``,
    ``stage.commit()``, one ``dump_stages`` per file) over stages loaded once from the repo index, without
    writing DVC's run cache (``.dvc/cache/runs``, a memo that lets ``dvc repro`` restore outputs of a stage run
    before; nothing here reads it). tests/e2e/test_dvc_roundtrip.py checks that ``dvc status`` is clean after it.
    """
    from dvc.repo import Repo, lock_repo  # heavy: dvc, only when the DAG syncs with DVC

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
        return made is None or all(norm_path(t.path) in made for t in st.targets.values())

    chosen: set[str] = set()
    out_paths: dict[str, list[str]] = {st.name: [norm_path(o.path) for o in st.outs] for st in stage_list}
    for st in stage_list:  # stage_list is in DAG order: a stage's producers come before it
        deps = [norm_path(p) for ps in st.deps.values() for p in ps]
        upstream = any(dep == out or dep.startswith(out + os.sep)
                       for name in chosen for out in out_paths[name] for dep in deps)
        if (ran(st) or st.name not in locked or upstream) and exists(st):
            chosen.add(st.name)
    return [st.name for st in stage_list if st.name in chosen]
