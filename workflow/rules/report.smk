# `protoclip report`: every declared paper target (config/experiments/*.yaml `target:` blocks) as tables and
# figures, each flagged for `snakemake --report results/report.html` with its generated caption
# (results/report/<id>.rst: the paper's caption, source, our config and the column mapping).
import os

from protoclip.report import targets as report_targets

report: "../report/workflow.rst"

TARGETS = report_targets.targets(PROJECT)


def _caption(target) -> str:
    # absolute: Snakemake joins caption paths to this file's folder; the file is written by this rule
    return os.path.abspath(report_targets.caption_path(LAYOUT.results_dir, target))


def target_files() -> dict:
    """Named outputs: the report-flagged table (.html) or figure (.png) of every target, and the rest."""
    out = {}
    for t in TARGETS:
        paths = [str(p) for p in report_targets.output_paths(LAYOUT.results_dir, t)]
        if t.kind == "table":
            csv, md, tex, html = paths
            out[t.id] = report(html, caption=_caption(t), category="Tables", labels={"target": t.id})
            out[f"{t.id}_files"] = [csv, md, tex]
        else:
            out[t.id] = report(paths[0], caption=_caption(t), category="Figures", labels={"target": t.id})
        out[f"{t.id}_caption"] = str(report_targets.caption_path(LAYOUT.results_dir, t))
    return out


rule report:
    """Paper tables (csv/md/tex/html, ours beside the paper's numbers) and figures from the runs' results."""
    input:
        summaries=expand(str(LAYOUT.results_dir / "runs" / "{run}" / "metrics.json"), run=RUNS),
        train_logs=expand(str(LAYOUT.results_dir / "runs" / "{run}" / "train_log.jsonl"), run=RUNS),
    output:
        index=str(report_targets.index_path(LAYOUT.results_dir)),
        **target_files(),
    conda:
        "../../environment.yml"
    log:
        "logs/report.log",
    benchmark:
        "benchmarks/report.tsv"
    params:
        cmd=cli("report"),
    shell:
        "{params.cmd} 2>&1 | tee {log}"
