rule report:
    """Tables (csv/md/tex) and figures regenerated from every run's metrics files."""
    input:
        unpack(stage_inputs(lambda wc: "report")),
    output:
        **outputs(STAGES["report"].targets),
    conda:
        "../../environment.yml"
    log:
        "logs/report.log",
    benchmark:
        "benchmarks/report.tsv"
    params:
        cmd=STAGES["report"].cmd,
    shell:
        "{params.cmd} 2>&1 | tee {log}"
