rule train:
    """Episodic CLIP / ProtoCLIP training of one configured run; checkpoints every episode (resumable)."""
    input:
        unpack(train_inputs),
    output:
        model=str(LAYOUT.results_dir / "runs" / "{run}" / "model.pt"),
        log=str(LAYOUT.results_dir / "runs" / "{run}" / "train_log.jsonl"),
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
        # resume: a job killed by the cluster continues from its last complete episode
        cmd=lambda wc: cli("train", f"--run {wc.run} --resume"),
    shell:
        "{params.cmd} 2>&1 | tee {log}"
