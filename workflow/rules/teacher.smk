rule teacher:
    """Frozen text teacher -> PCA-reduced caption features keyed by sample id."""
    input:
        manifest=str(LAYOUT.manifest),
    output:
        features=str(LAYOUT.data_dir / "teacher" / "{teacher}.npz"),
    conda:
        "../../environment.yml"
    log:
        "logs/teacher_{teacher}.log",
    benchmark:
        "benchmarks/teacher_{teacher}.tsv"
    wildcard_constraints:
        teacher="|".join(TEACHER_BY_FILE) or "NO_TEACHERS",
    params:
        settings=settings(PROJECT.teacher),
        cmd=lambda wc: cli("teacher", f"--name {TEACHER_BY_FILE[wc.teacher]}"),
    shell:
        "{params.cmd} 2>&1 | tee {log}"
