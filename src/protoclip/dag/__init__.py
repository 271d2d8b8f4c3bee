"""The workflow's DAG: the stage graph, its two runners' glue (Snakemake, DVC) and the config's generated schema.

Only the workflow (Snakefile, workflow/rules) and the CLI's ``runs``, ``dvc-yaml`` and ``schema`` commands use this
package; the stages' own code never does. Its modules: docs/architecture.md, "The DAG".
"""
