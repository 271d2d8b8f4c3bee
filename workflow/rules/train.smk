rule train:
    """Episodic CLIP / ProtoCLIP training of one configured run; checkpoints every episode (resumable)."""
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
    resources:
        gpu=lambda wc: 1 if PROJECT.run(wc.run).gpu else 0,
    params:
        settings=lambda wc: settings(PROJECT.run(wc.run)),
        cmd=stage_cmd(lambda wc: f"train_{wc.run}"),
    shell:
        "{params.cmd} 2>&1 | tee {log}"
