# Shared by every rule: the validated project config (protoclip.config: unknown keys and wrong types stop
# here, before any job runs) and the stages (protoclip.dag.stages: each rule's inputs, outputs and command, the
# same ones dvc.yaml holds).
import json
import os
import sys

from protoclip.errors import ConfigError
from protoclip.schema import to_dict
from protoclip.config import load_config
from protoclip.layout import Layout
from protoclip import launch
from protoclip.dag import dvc_sync, resources as job_sizes, snakemake as dag_snakemake, stages as dag_stages

DEFAULT_CONFIG = "config/config.yaml"
# Snakemake's `config` is the Snakefile's configfile extended by every --configfile, then by --config. The
# commands read exactly that: the default file when nothing is overridden (the commands of dvc.yaml), else the
# merged config written to .snakemake/protoclip/config.yaml (README: "Overriding the config").
CONFIG_FILE = dag_snakemake.resolve_config(
    config, DEFAULT_CONFIG, [str(f) for f in workflow.config_settings.configfiles],
    dict(workflow.config_settings.config or {}))
try:
    PROJECT = load_config(CONFIG_FILE)
except ConfigError as err:  # one line naming key and file, exit 2, as the protoclip CLI says it: no traceback
    print(f"protoclip: {err.kind}: {err}", file=sys.stderr)
    sys.exit(2)
LAYOUT = Layout.from_config(PROJECT)
RUNS = PROJECT.run_names()
DATASETS = list(PROJECT.evaluate.datasets)
STAGES = {s.name: s for s in dag_stages.stages(PROJECT, CONFIG_FILE)}
if CONFIG_FILE != DEFAULT_CONFIG:
    print(f"protoclip: config overrides in effect: every command reads {CONFIG_FILE}", file=sys.stderr)

# teacher cache file stem -> teacher name (names with '/' become single path components)
TEACHER_BY_FILE = {LAYOUT.teacher_features(t).stem: t for t in dag_stages.teachers(PROJECT)}


def outputs(outs: dict) -> dict:
    """Snakemake outputs from a stage's targets (protoclip.dag.stages.Out): folders as directory()."""
    return dag_snakemake.outputs(outs, directory)


def stage_inputs(name_of):
    """Input function: the deps of the stage named ``name_of(wildcards)`` (use with unpack)."""
    return lambda wc: STAGES[name_of(wc)].inputs()


def stage_cmd(name_of):
    return lambda wc: STAGES[name_of(wc)].cmd


def settings(obj) -> str:
    """A config section as canonical JSON: used as a rule param, so that editing it reruns the rule."""
    return json.dumps(to_dict(obj), sort_keys=True)


# --------------------------------------------------------------------------- job sizes (protoclip.dag.resources)
# A job's GPU count comes from the project config; its threads, and on SLURM its sbatch resources, are sized per
# GPU: on one machine from --cores / --resources gpu of the call, on SLURM from workflow/profiles/slurm/site.yaml.
SLURM_EXECUTORS = ("slurm", "slurm-jobstep")  # the slurm profile's executor and the job step it runs in the job
_SITE = []


def on_slurm() -> bool:
    """Whether jobs run through SLURM: the slurm profile's executor, the job step it runs in the allocation, or
    the Snakemake that step starts with srun to run the job (remote mode, inside a SLURM job; a Snakemake run by
    hand inside `salloc` is not remote). Known once execution starts, which is when Snakemake evaluates a rule's
    threads and resources (so the local runs never read the site file)."""
    plugin = workflow.executor_plugin
    if plugin is not None and plugin.name in SLURM_EXECUTORS:
        return True
    return workflow.remote_exec and "SLURM_JOB_ID" in os.environ


def site():
    if not _SITE:
        try:
            _SITE.append(job_sizes.load_site(job_sizes.SITE_FILE))
        except ConfigError as err:
            print(f"protoclip: {err.kind}: {err}", file=sys.stderr)
            sys.exit(2)
    return _SITE[0]


def gpu_slots() -> int:
    """--resources gpu=N of this call (0 when not given)."""
    res = workflow.global_resources.get("gpu")
    value = getattr(res, "value", res)
    return value if isinstance(value, int) else 0


def job_threads(gpus_of):
    """A rule's threads: ``gpus_of(wildcards)`` GPUs x threads per GPU (1 for a job without GPU, locally)."""
    def threads(wildcards):
        k = gpus_of(wildcards)
        if on_slurm():
            return job_sizes.slurm_threads(site(), k)
        return job_sizes.local_threads(k, workflow.cores, gpu_slots())
    return threads


def job_resources(gpus_of, cpus: bool = True) -> dict:
    """A rule's resources: ``gpu`` (the GPU slots it takes; SLURM --gpus) and, on SLURM, the site's sbatch
    resources for that many GPUs (None elsewhere: Snakemake drops them). ``cpus=False``: CPUs = the rule's
    own threads."""
    def slurm(name):
        def value(wildcards):
            if not on_slurm():
                return None
            return job_sizes.slurm_resources(site(), gpus_of(wildcards)).get(name)
        return value
    names = ["nodes", "mem_mb_per_cpu", "runtime", "slurm_partition", "slurm_account"] + (["cpus_per_task"] if cpus else [])
    return {"gpu": lambda wildcards: gpus_of(wildcards), **{name: slurm(name) for name in names}}
