rule evaluate:
    """Every configured task of one data set on one trained run: one job per (run, set), run in parallel;
    a set that fails or is added later does not redo the others (skipped sets write their reason)."""
    input:
        unpack(stage_inputs(lambda wc: f"evaluate_{wc.run}_{wc.dataset}")),
    output:
        **outputs(dag_stages.eval_outs(LAYOUT, "{run}", "{dataset}")),
    conda:
        "../../environment.yml"
    log:
        "logs/evaluate_{run}_{dataset}.log",
    benchmark:
        "benchmarks/evaluate_{run}_{dataset}.tsv"
    wildcard_constraints:
        run="|".join(RUNS) or "NO_RUNS",
        dataset="|".join(DATASETS) or "NO_DATASETS",
    threads: job_threads(lambda wc: launch.evaluate_gpus(PROJECT, wc.run))
    resources:
        **job_resources(lambda wc: launch.evaluate_gpus(PROJECT, wc.run)),  # one GPU for a GPU run's evaluation
    params:
        config=CONFIG_ARG,
        code=CODE["evaluate"],
        # a released checkpoint's run (`pretrained:`, no train job) reruns when the checkpoint it names changes
        settings=lambda wc: settings({**to_dict(PROJECT.evaluate), "datasets": PROJECT.evaluate.datasets[wc.dataset],
                                      **dag_stages.pretrained_settings(PROJECT, wc.run)}),
        args=stage_args(lambda wc: f"evaluate_{wc.run}_{wc.dataset}"),
    shell:
        "protoclip evaluate --config {params.config}{params.args} 2>&1 | tee {log}"


rule collect:
    """A run's per-set metrics files -> results/runs/<run>/metrics.json (cheap: runs on the main node)."""
    input:
        unpack(stage_inputs(lambda wc: f"collect_{wc.run}")),
    output:
        **outputs(dag_stages.collect_outs(LAYOUT, "{run}")),
    conda:
        "../../environment.yml"
    log:
        "logs/collect_{run}.log",
    wildcard_constraints:
        run="|".join(RUNS) or "NO_RUNS",
    params:
        config=CONFIG_ARG,
        code=CODE["collect"],
        args=stage_args(lambda wc: f"collect_{wc.run}"),
    localrule: True
    shell:
        "protoclip collect --config {params.config}{params.args} 2>&1 | tee {log}"
