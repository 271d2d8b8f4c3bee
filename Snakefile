# protoclip-repro workflow: prepare -> teacher -> train(run) -> evaluate(run) -> report.
# Run:  snakemake --cores 2                       (offline default, CPU)
#       snakemake --profile workflow/profiles/gpu (GPU machine)   |   --profile workflow/profiles/slurm
configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/teacher.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/toy.smk"


rule all:
    input:
        rules.report.output,
        rules.toy_nemd.output,
    default_target: True
