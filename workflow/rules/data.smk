rule prepare:
    """Pinned Debian packages -> offline caption corpus + eval sets (and user data from config paths)."""
    output:
        manifest=str(LAYOUT.manifest),
        report=str(LAYOUT.prepare_report),
        eval_sets=[str(LAYOUT.eval_set(s)) for s in PROJECT.prepare.eval_sets],
    conda:
        "../../environment.yml"
    log:
        "logs/prepare.log",
    benchmark:
        "benchmarks/prepare.tsv"
    params:
        settings=settings(PROJECT.prepare),
        cmd=cli("prepare"),
    shell:
        "{params.cmd} 2>&1 | tee {log}"
