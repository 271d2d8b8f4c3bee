# protoclip-repro workflow: prepare -> teacher -> train(run) -> evaluate(run, set) -> collect(run) -> report.
# Run:  snakemake --cores 2                       (offline default, CPU; workflow/profiles/default applies)
#       snakemake --profile workflow/profiles/gpu (GPU machine)   |   --profile workflow/profiles/slurm
# Each rule's inputs, outputs and command come from protoclip.dag.stages, like dvc.yaml's stages; after a
# successful run, `onsuccess` records the outputs in dvc.lock (dvc commit), so DVC tracks what Snakemake made.
from snakemake.utils import min_version

min_version("9.27")

# The config: config/config.yaml, or the --configfile files alone (workflow/rules/common.smk; docs/config.md).


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/teacher.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/toy.smk"
include: "workflow/rules/export.smk"


rule all:
    input:
        rules.report.output,
        rules.toy_nemd.output,
    default_target: True


onsuccess:
    # record in dvc.lock what this invocation's jobs made (finished jobs), plus stages the lock lacks
    dvc_sync.dvc_commit(PROJECT, CONFIG_FILE, DEFAULT_CONFIG,
                        made={str(f) for job in workflow.dag.jobs if workflow.dag.finished(job) for f in job.output})
    if skipped_summary():  # the last line a user with part of the data reads
        print(f"protoclip: {skipped_summary()}", file=sys.stderr)
