rule teacher:
    """Frozen text teacher -> PCA-reduced caption features keyed by sample id."""
    input:
        unpack(stage_inputs(lambda wc: f"teacher_{wc.teacher}")),
    output:
        **outputs(dag_stages.teacher_outs(LAYOUT, "{teacher}")),
    conda:
        "../../environment.yml"
    log:
        "logs/teacher_{teacher}.log",
    benchmark:
        "benchmarks/teacher_{teacher}.tsv"
    wildcard_constraints:
        teacher="|".join(TEACHER_BY_FILE) or "NO_TEACHERS",
    # a GPU job in a project that trains on GPUs (protoclip.jobs.launch.teacher_gpus): placed like train / evaluate
    threads: job_threads(lambda wc: launch.teacher_gpus(PROJECT))
    resources:
        **job_resources(lambda wc: launch.teacher_gpus(PROJECT)),
    params:
        config=CONFIG_ARG,
        code=CODE["teacher"],
        settings=settings(PROJECT.teacher),
        args=stage_args(lambda wc: f"teacher_{wc.teacher}"),
    shell:
        "protoclip teacher --config {params.config}{params.args} 2>&1 | tee {log}"
