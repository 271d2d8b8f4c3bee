"""Job sizes per GPU (protoclip.dag.resources): threads on one node, sbatch resources from the site file."""
from __future__ import annotations

import pytest

from protoclip.dag.resources import SITE_FILE, SiteConfig, load_site, local_threads, slurm_resources, slurm_threads
from protoclip.errors import ConfigError
from testkit import REPO


def test_threads_on_one_node_are_cores_per_gpu_slot():
    assert local_threads(1, 32, 8) == 4 and local_threads(2, 32, 8) == 8  # 8 one-GPU jobs fit 32 cores
    assert local_threads(0, 32, 8) == 1  # a job without GPU: 1 thread (the offline default's jobs)
    assert local_threads(1, 2, 4) == 1 and local_threads(3, 2, 0) == 6  # at least 1 per GPU; no --resources gpu


def test_slurm_jobs_are_sized_per_gpu_on_one_node():
    site = SiteConfig(account="proj42", partition="gpu", cpu_partition="cpu", cpus_per_gpu=8, mem_mb_per_gpu=64000,
                      cpus=4, mem_mb=16000, runtime=600)
    two = slurm_resources(site, 2)
    assert two == {"nodes": 1, "cpus_per_task": 16, "mem_mb_per_cpu": 8000, "runtime": 600,
                   "slurm_partition": "gpu", "slurm_account": "proj42"}
    assert two["cpus_per_task"] * two["mem_mb_per_cpu"] == 2 * 64000 and slurm_threads(site, 2) == 16
    cpu = slurm_resources(site, 0)
    assert (cpu["cpus_per_task"], cpu["cpus_per_task"] * cpu["mem_mb_per_cpu"], cpu["slurm_partition"]) == (4, 16000, "cpu")
    odd = slurm_resources(SiteConfig(cpus_per_gpu=3, mem_mb_per_gpu=1000), 1)  # memory per CPU rounded up
    assert odd["mem_mb_per_cpu"] == 334 and "slurm_account" not in odd and "slurm_partition" not in odd


def test_site_file_is_read_strictly(tmp_path):
    shipped = load_site(REPO / SITE_FILE)  # the repository's, as a user finds it
    assert shipped.partition == "gpu" and shipped.account is None
    bad = tmp_path / "site.yaml"
    bad.write_text("acount: x\n")
    with pytest.raises(ConfigError, match="unknown key 'acount'"):
        load_site(bad)
    bad.write_text("cpus_per_gpu: 0\n")
    with pytest.raises(ConfigError, match="cpus_per_gpu must be >= 1"):
        load_site(bad)
