rule toy_nemd:
    """PAUC's NEMD toy experiment (pauc-nemd Fig. 2): PCL vs PAUC on 3-D Gaussian blobs (needs no data)."""
    output:
        **outputs(STAGES["toy_nemd"].targets),
    conda:
        "../../environment.yml"
    log:
        "logs/toy_nemd.log",
    benchmark:
        "benchmarks/toy_nemd.tsv"
    threads: job_threads(lambda wc: 0)
    resources:
        **job_resources(lambda wc: 0),  # on SLURM: a CPU job of the site
    params:
        config=CONFIG_ARG,
        code=CODE["toy-nemd"],
        settings=settings(PROJECT.toy),
    shell:
        "protoclip toy-nemd --config {params.config} 2>&1 | tee {log}"
