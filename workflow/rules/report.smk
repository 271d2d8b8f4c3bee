# `protoclip report`: every declared paper target (config/experiments/*.yaml `target:` blocks) as tables and
# figures, each flagged for `snakemake --report results/report.html` with its generated caption
# (results/report/<id>.rst: the paper's caption, source, our config and the column mapping).
report: "../report/workflow.rst"


rule report:
    """Paper tables (csv/md/tex/html, ours beside the paper's numbers) and figures from the runs' results."""
    input:
        unpack(stage_inputs(lambda wc: "report")),
    output:
        # the same files as protoclip.dag.stages.report_stage (target_outputs), tables/figures flagged for the report
        **dag_snakemake.report_outputs(PROJECT, report),
    conda:
        "../../environment.yml"
    log:
        "logs/report.log",
    benchmark:
        "benchmarks/report.tsv"
    threads: last_job_threads
    resources:
        **job_resources(lambda wc: 0),  # on SLURM: a CPU job of the site
    params:
        config=CONFIG_ARG,
        code=CODE["report"],
        # the declared tables, figures and claims (captions, rows, columns): a changed one rewrites the report
        settings=settings({"targets": PROJECT.paper_targets(), "claims": PROJECT.claims,
                           "claim_list": PROJECT.paper_claims()}),
    shell:
        "protoclip report --config {params.config} 2>&1 | tee {log}"
