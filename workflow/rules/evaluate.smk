rule evaluate:
    """Every evaluation task on every configured data set for one trained run (skipped sets are reported)."""
    input:
        model=str(LAYOUT.results_dir / "runs" / "{run}" / "model.pt"),
        manifest=str(LAYOUT.manifest),  # held-out caption pairs (retrieval, coarse labels)
        eval_sets=[str(LAYOUT.eval_set(s)) for s in PROJECT.prepare.eval_sets],
    output:
        summary=str(LAYOUT.results_dir / "runs" / "{run}" / "metrics.json"),
    conda:
        "../../environment.yml"
    log:
        "logs/evaluate_{run}.log",
    benchmark:
        "benchmarks/evaluate_{run}.tsv"
    wildcard_constraints:
        run="|".join(RUNS) or "NO_RUNS",
    resources:
        gpu=lambda wc: 1 if PROJECT.run(wc.run).gpu else 0,
    params:
        settings=settings(PROJECT.evaluate),
        cmd=lambda wc: cli("evaluate", f"--run {wc.run}"),
    shell:
        "{params.cmd} 2>&1 | tee {log}"
