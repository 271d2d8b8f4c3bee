rule report:
    """Tables (csv/md/tex) and figures regenerated from every run's metrics files."""
    input:
        summaries=expand(str(LAYOUT.results_dir / "runs" / "{run}" / "metrics.json"), run=RUNS),
        train_logs=expand(str(LAYOUT.results_dir / "runs" / "{run}" / "train_log.jsonl"), run=RUNS),
    output:
        index=str(LAYOUT.tables / "index.md"),
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
