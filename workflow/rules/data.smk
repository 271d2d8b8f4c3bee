rule prepare:
    """Pinned Debian packages -> offline caption corpus + eval sets (and user data from config paths)."""
    input:
        unpack(stage_inputs(lambda wc: "prepare")),
    output:
        **outputs(STAGES["prepare"].targets),
    conda:
        "../../environment.yml"
    log:
        "logs/prepare.log",
    benchmark:
        "benchmarks/prepare.tsv"
    threads: PROJECT.prepare.num_workers  # prepare renders SVGs and scans shards in that many processes
    resources:
        **job_resources(lambda wc: 0, cpus=False),  # on SLURM: a CPU job of the site, with its threads as CPUs
    params:
        config=CONFIG_ARG,
        code=CODE["prepare"],
        # what prepare writes depends on (its worker count does not change it)
        settings=settings({k: v for k, v in to_dict(PROJECT.prepare).items() if k != "num_workers"}),
    shell:
        "protoclip prepare --config {params.config} 2>&1 | tee {log}"
