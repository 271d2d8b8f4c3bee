rule toy_nemd:
    """PAUC's NEMD toy experiment (pauc-nemd Fig. 2): PCL vs PAUC on 3-D Gaussian blobs, ~1-2 min on 2 CPU cores."""
    output:
        figure=str(LAYOUT.results_dir / "toy" / "fig_pauc_toy.png"),
        csv=str(LAYOUT.results_dir / "toy" / "pauc_toy.csv"),
        md=str(LAYOUT.results_dir / "toy" / "pauc_toy.md"),
    conda:
        "../../environment.yml"
    log:
        "logs/toy_nemd.log",
    benchmark:
        "benchmarks/toy_nemd.tsv"
    params:
        settings=settings(PROJECT.toy),
        cmd=cli("toy-nemd"),
    shell:
        "{params.cmd} 2>&1 | tee {log}"
