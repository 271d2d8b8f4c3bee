"""`pip install -e '.[gpu]'` in a fresh venv, as a GPU machine installs the project (.ci/check-gpu-extra): exactly one
faiss distribution (faiss-gpu-cu12, no faiss-cpu beside it), faiss's GPU symbols (StandardGpuResources; no GPU needed
to import them; with one, a k-means on it) and `pip check` clean. It downloads from the package index what the
local cache lacks (faiss-gpu-cu12 48 MB, CUDA 12 runtime and cuBLAS) and installs the whole environment (~6 GB)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from testkit import REPO


def test_gpu_extra_installs_one_faiss_with_gpu_support_and_a_clean_pip_check(tmp_path):
    if shutil.disk_usage(tmp_path).free < 12e9:
        pytest.skip("under 12 GB free for a fresh venv with torch and faiss-gpu-cu12")
    out = subprocess.run([str(REPO / ".ci" / "check-gpu-extra"), sys.executable], cwd=REPO, capture_output=True,
                         text=True, timeout=3600, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "gpu extra: faiss 1.14.1 (faiss-gpu-cu12), GPU symbols present" in out.stdout, out.stdout
    assert "No broken requirements found." in out.stdout
