# Shared by every rule: the validated project config (protoclip.project: unknown keys and wrong types stop
# here, before any job runs) and the stages (protoclip.dag.stages: each rule's inputs, outputs and command, the
# same ones dvc.yaml holds).
import os
import shlex
import sys

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from protoclip.errors import ConfigError
from protoclip.config.strict import deep_merge, read_yaml, to_dict
from protoclip.project import load_config
from protoclip.files.layout import Layout
from protoclip.jobs import launch
from protoclip.dag import code_version, dvc_sync, resources as job_sizes
from protoclip.dag import snakemake as dag_snakemake, stages as dag_stages
from protoclip.dag.snakemake import schema_error

DEFAULT_CONFIG = "config/config.yaml"
# One config model (docs/config.md): `snakemake` alone reads config/config.yaml; with
# --configfile, the given files alone, merged in order (an overlay such as my-site.yaml on top of
# config/paper.yaml), never on top of the offline default; --config keys go on top of either. The commands read
# exactly that: the one file itself when nothing is merged onto it (the commands of dvc.yaml), else the merged
# config written to .snakemake/protoclip/config.yaml.
CLI_CONFIGFILES = [dag_snakemake.display_path(f) for f in workflow.config_settings.configfiles]
try:
    if (repeated := dag_snakemake.repeated_configfile_flag(sys.argv)):
        raise ConfigError(repeated)
    if not CLI_CONFIGFILES:
        config.update(deep_merge(read_yaml(DEFAULT_CONFIG), dict(config)))
    # the assembled config against the schema made from the config classes (`protoclip schema`);
    # set_default=False keeps `config` as written
    try:
        validate(config, "../schemas/config.schema.yaml", set_default=False)  # relative to this file
    except WorkflowError as err:
        raise ConfigError(schema_error(err)) from None
    CONFIG_FILE = dag_snakemake.resolve_config(
        config, DEFAULT_CONFIG, CLI_CONFIGFILES, dict(workflow.config_settings.config or {}))
    PROJECT = load_config(CONFIG_FILE)
except ConfigError as err:  # one line naming key and file, exit 2, as the protoclip CLI says it: no traceback
    print(f"protoclip: {err.kind}: {err}", file=sys.stderr)
    sys.exit(2)
# the config file the commands pass, as every rule's `config` param: one Snakemake does not record (which file
# holds the config is no reason to rerun a job; its settings are, `settings()` below)
CONFIG_ARG = dag_snakemake.UntrackedParam(shlex.quote(CONFIG_FILE))
LAYOUT = Layout.from_config(PROJECT)
# runs whose training data is absent get no job (protoclip.dag.stages); the rest run, and the report lists these
SKIPPED_RUNS = PROJECT.runs_without_data()
RUNS = [r for r in PROJECT.run_names() if r not in SKIPPED_RUNS]
DATASETS = list(PROJECT.evaluate.datasets)
STAGES = {s.name: s for s in dag_stages.stages(PROJECT, CONFIG_FILE)}
if CONFIG_FILE == dag_snakemake.RESOLVED_CONFIG:
    print(f"protoclip: config overrides in effect: every command reads {CONFIG_FILE}", file=sys.stderr)

# The code each command runs, comments and docstrings left out (protoclip.dag.code_version): every rule has its
# command's value as the `code` param, so Snakemake's params trigger reruns the jobs whose code changed, and the
# values go to code-fingerprints.yaml, the DVC params file of the same stages (both tools, one rule; docs/dvc.md);
# each file is parsed once per version (code_version.CACHE, under .snakemake/)
CODE = code_version.write_fingerprints(cache=code_version.CACHE)

# teacher cache file stem -> teacher name (names with '/' become single path components)
TEACHER_BY_FILE = {LAYOUT.teacher_features(t).stem: t for t in dag_stages.teachers(PROJECT, SKIPPED_RUNS)}


def skipped_summary() -> str | None:
    """One line: how many runs are skipped and why (None when none is)."""
    return dag_snakemake.skipped_summary(SKIPPED_RUNS, len(PROJECT.run_names()))


if skipped_summary():
    print(f"protoclip: {skipped_summary()}", file=sys.stderr)


def outputs(outs: dict) -> dict:
    """Snakemake outputs from a stage's targets (protoclip.dag.stages.Out): folders as directory()."""
    return dag_snakemake.outputs(outs, directory)


def stage_inputs(name_of):
    """Input function: the deps of the stage named ``name_of(wildcards)`` (use with unpack)."""
    return lambda wc: STAGES[name_of(wc)].inputs()


def stage_args(name_of):
    """The arguments of stage ``name_of(wildcards)``'s command after ``--config <file>`` (a param of the job's
    rule, as they name the job), with a leading space when there are any."""
    return lambda wc: f" {STAGES[name_of(wc)].args}" if STAGES[name_of(wc)].args else ""


def settings(section) -> str:
    """A job's own resolved settings as a digest (a param of its rule, so editing them reruns the job)."""
    return dag_snakemake.settings_digest(to_dict(section))


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
        return job_sizes.local_threads(k, call_cores(k), gpu_slots())
    return threads


def last_job_threads(wildcards):
    """The report's threads: every core of the call locally (the DAG's last job: nothing else runs beside it; its
    claims ledger splits AMI resamples over them), the site's CPU-job size on SLURM."""
    if on_slurm():
        return job_sizes.slurm_threads(site(), 0)
    return call_cores(0)


def call_cores(n_gpus: int) -> int:
    """--cores of this call; a call without (`snakemake --report`, a dry run) sizes a k-GPU job at k threads,
    as `workflow.cores` itself raises there."""
    cores = workflow.global_resources["_cores"].value
    return cores if isinstance(cores, int) else max(1, n_gpus)


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
