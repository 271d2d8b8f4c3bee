"""The workflow's DAG: the stage graph and its two runners' glue (Snakemake, DVC).

``stages`` (every stage instance: command, inputs, outputs, DVC params; writes dvc.yaml), ``snakemake`` (the
config the rules' commands read, the rules' outputs), ``dvc_sync`` (``dvc commit`` of what a ``snakemake``
invocation made), ``filetimes`` (output times put back in DAG order after that commit), ``schema`` (the
config's JSON Schema in workflow/schemas and config/README.md, generated from ``ProjectConfig``). Only the workflow
(Snakefile, workflow/rules) and ``protoclip dvc-yaml`` use this package; the stages' own code never does.
"""
