rule train:
    """Episodic CLIP / ProtoCLIP training of one configured run; checkpoints every episode (resumable: a killed
    job's rerun continues from the checkpoint, its log from the records kept beside it)."""
    input:
        unpack(stage_inputs(lambda wc: f"train_{wc.run}")),
    output:
        **outputs(dag_stages.train_outs(LAYOUT, "{run}")),
    conda:
        "../../environment.yml"
    log:
        "logs/train_{run}.log",
    benchmark:
        "benchmarks/train_{run}.tsv"
    wildcard_constraints:
        run="|".join(RUNS) or "NO_RUNS",
    # a run's `gpu: k`: k GPU slots (protoclip.jobs.launch places the job on k free ids; k > 1 runs torchrun, each rank
    # with threads / k); threads and, on SLURM, CPUs and memory sized per GPU (common.smk: job sizes)
    threads: job_threads(lambda wc: launch.train_gpus(PROJECT.run(wc.run)))
    resources:
        **job_resources(lambda wc: launch.train_gpus(PROJECT.run(wc.run))),
    params:
        config=CONFIG_ARG,
        code=CODE["train"],
        settings=lambda wc: settings(PROJECT.run(wc.run)),
        args=stage_args(lambda wc: f"train_{wc.run}"),
    shell:
        # PROTOCLIP_JOB_PID: the process running this job (Snakemake, or its job step on a cluster); the trainer
        # ends when it or this shell ends, instead of training on beside a rerun (protoclip.jobs.launch.follow_job)
        "PROTOCLIP_JOB_PID=$PPID protoclip train --config {params.config}{params.args} 2>&1 | tee {log}"
