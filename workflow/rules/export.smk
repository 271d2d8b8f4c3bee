# Models for the field's own tools (protoclip.models.export_openclip): `snakemake export_all --cores 2` writes an
# open_clip `local-dir:` folder for every trained run open_clip can represent. Not part of `all` (the report does
# not read them) and no DVC stage: a folder per run is a hand-off, made on demand from the cached model.pt.
# Which runs open_clip can represent is decided when export_all is asked for (an input function): deciding it
# here would import torch and open_clip into every Snakemake start, each SLURM job's own included.


rule export:
    """One run's model.pt as an open_clip folder (open_clip_config.json + open_clip_model.safetensors)."""
    input:
        model=lambda wc: str(LAYOUT.model(wc.run)),
    output:
        directory(str(LAYOUT.export_dir("{run}"))),
    conda:
        "../../environment.yml"
    log:
        "logs/export_{run}.log",
    threads: job_threads(lambda wc: 0)
    resources:
        **job_resources(lambda wc: 0),  # on SLURM: a CPU job of the site
    wildcard_constraints:
        run="|".join(PROJECT.run_names()) or "NO_RUNS",  # `protoclip export` refuses the others, saying why
    params:
        config=CONFIG_ARG,
        code=CODE["export"],
    shell:
        "protoclip export --config {params.config} --run {wildcards.run} --out {output} 2>&1 | tee {log}"


rule export_all:
    """Every run open_clip can represent (nCLIP and multi-class-token runs cannot: export_openclip.export_refusal)."""
    input:
        lambda wc: expand(rules.export.output, run=dag_stages.exportable_runs(PROJECT)),
