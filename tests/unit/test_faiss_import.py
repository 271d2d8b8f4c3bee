"""faiss loads through protoclip.prototypes.kmeans.load_faiss without its loader's fallback messages
("No module named 'faiss.swigfaiss_avx512'") in an INFO log, and names the instruction set it loaded once."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("faiss")
from testkit import REPO

SNIPPET = """
import logging
logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")  # as the CLI does
{body}
"""


def run(body: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    env.pop("FAISS_OPT_LEVEL", None)
    out = subprocess.run([sys.executable, "-c", SNIPPET.format(body=body)], env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    return out.stderr


def test_plain_faiss_import_is_noisy_at_info():
    """The noise this guards against (so the test below can fail): faiss's loader logs each missing build."""
    import faiss  # noqa: F401  (the test process: only to know which builds this wheel has)

    from protoclip.prototypes.kmeans import FAISS_BUILDS

    missing = [m for m in list(FAISS_BUILDS)[:3] if f"faiss.{m}" not in sys.modules]
    if not missing:
        pytest.skip("this faiss wheel loaded its AVX512-SPR build: its loader logs no fallback")
    assert "Could not load library" in run("import faiss")


def test_kmeans_module_loads_faiss_quietly_and_names_the_instruction_set():
    err = run("from protoclip.prototypes.kmeans import kmeans, load_faiss\n"
              "import numpy as np\n"
              "kmeans(np.random.default_rng(0).normal(size=(64, 4)).astype('float32'), k=4, iters=2,"
              " backend='faiss', seed=0)\n"
              "load_faiss()\n")
    assert "ModuleNotFoundError" not in err and "Could not load library" not in err, err
    loaded = [line for line in err.splitlines() if "faiss" in line and "instruction set" in line]
    assert len(loaded) == 1, err
    assert any(name in loaded[0] for name in ("AVX512-SPR", "AVX512", "AVX2", "SVE", "generic")), loaded
