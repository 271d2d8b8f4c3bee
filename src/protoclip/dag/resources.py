"""What a job asks of the machine or the cluster, sized per GPU: its threads and, on SLURM, its sbatch resources.

A job's GPU count k comes from the config (a run's ``gpu: k`` for its train job, 1 for a GPU run's evaluation or
a GPU project's teacher, 0 otherwise: ``protoclip.jobs.launch``); the rules size their jobs here (``common.smk``'s
``job_threads``, ``job_resources``), a k-GPU job k times a one-GPU job.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from protoclip.errors import ConfigError
from protoclip.config.strict import build, read_yaml

SITE_FILE = "workflow/profiles/slurm/site.yaml"


@dataclass
class SiteConfig:
    """A SLURM site: where jobs go and how big they are (``workflow/profiles/slurm/site.yaml``)."""

    account: str | None = None  # sbatch -A; null: none given (the plugin looks for your default account)
    partition: str | None = None  # sbatch -p of GPU jobs; null: the cluster's default partition
    cpu_partition: str | None = None  # sbatch -p of jobs without GPU; null: `partition`
    cpus_per_gpu: int = 8  # a k-GPU job gets k x this many CPUs (and threads)
    mem_mb_per_gpu: int = 64000  # ... and k x this much memory (MB)
    cpus: int = 4  # a job without GPU: CPUs (prepare, report, a CPU run's evaluation)
    mem_mb: int = 16000  # a job without GPU: memory (MB)
    runtime: int = 2880  # time limit of every job, minutes (sbatch -t)

    def validate(self) -> None:
        for name in ("cpus_per_gpu", "mem_mb_per_gpu", "cpus", "mem_mb", "runtime"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def load_site(path: str | Path = SITE_FILE) -> SiteConfig:
    """The site file, strictly (unknown keys and wrong types stop with the key and file named)."""
    site = build(SiteConfig, read_yaml(path), where=str(path))
    try:
        site.validate()
    except ValueError as err:
        raise ConfigError(f"{path}: {err}") from None
    return site


def local_threads(n_gpus: int, cores: int, gpu_slots: int) -> int:
    """Threads of a job on one machine: ``n_gpus`` x cores per GPU slot (at least 1 each), 1 without GPU.

    ``cores`` and ``gpu_slots`` are the Snakemake call's ``--cores`` and ``--resources gpu=N``, so as many GPU jobs
    as slots fit the cores; a k-GPU training then runs k ranks of threads / k each
    (:func:`protoclip.jobs.launch.rank_threads`)."""
    if n_gpus <= 0:
        return 1
    return n_gpus * max(1, cores // max(1, gpu_slots))


def slurm_threads(site: SiteConfig, n_gpus: int) -> int:
    """Threads (= CPUs) of a SLURM job: per GPU from the site, or the site's CPU-job size."""
    return n_gpus * site.cpus_per_gpu if n_gpus > 0 else site.cpus


def slurm_resources(site: SiteConfig, n_gpus: int) -> dict:
    """The Snakemake resources the SLURM executor plugin turns into sbatch options, for a job of ``n_gpus``
    GPUs (``gpu`` itself is the rule's own resource: ``--gpus=k``; 0 asks for none). Memory goes per CPU
    (``--mem-per-cpu``, rounded up): k x cpus_per_gpu CPUs then hold k x mem_mb_per_gpu (Snakemake's ``mem_mb``
    would have to be a number on the local executor too). A k-GPU job asks for k times the site's per-GPU CPUs
    and memory on one node (``torchrun --standalone`` is single-node)::

        site = load_site("workflow/profiles/slurm/site.yaml")
        slurm_resources(site, 2)   # {'nodes': 1, 'cpus_per_task': 16, 'mem_mb_per_cpu': 8000, 'runtime': 2880, ...}
    """
    cpus = slurm_threads(site, n_gpus)
    mem = n_gpus * site.mem_mb_per_gpu if n_gpus > 0 else site.mem_mb
    out = {"nodes": 1, "cpus_per_task": cpus, "mem_mb_per_cpu": -(-mem // cpus), "runtime": site.runtime}
    partition = site.partition if n_gpus > 0 else (site.cpu_partition or site.partition)
    if partition:
        out["slurm_partition"] = partition
    if site.account:
        out["slurm_account"] = site.account
    return out
