"""A command whose package is a pip extra that the environment lacks stops with one line naming the extra (no
traceback); k-means without faiss runs the torch backend and says so once. The package is made missing by a None
entry in sys.modules (Python's import then raises ModuleNotFoundError for that name)."""
from __future__ import annotations

import importlib
import logging
import re
import sys

import numpy as np
import pytest
import torch

from protoclip.cli import main
from protoclip.errors import MissingExtraError, import_extra
from protoclip.evaluate.metrics.clustering import kmeans_labels
from protoclip.evaluate.prompts import build_prompts

kmeans_mod = importlib.import_module("protoclip.prototypes.kmeans")  # the module (the package exports its function)


def test_import_extra_names_the_extra_and_passes_other_import_errors(monkeypatch):
    monkeypatch.setitem(sys.modules, "av", None)
    with pytest.raises(MissingExtraError) as err:
        import_extra("av", "ucf101", "protoclip ucf101")
    assert str(err.value) == "protoclip ucf101 needs the 'ucf101' extra (av is not installed): pip install -e '.[ucf101]'"
    assert isinstance(err.value, ImportError)  # code that falls back on ImportError still does
    # an installed package that fails to load something of its own is not a missing extra: its error goes through
    monkeypatch.setitem(sys.modules, "json.decoder", None)
    monkeypatch.delitem(sys.modules, "json")
    with pytest.raises(ImportError) as err:
        import_extra("json", "x", "y")
    assert not isinstance(err.value, MissingExtraError)


def test_ucf101_without_pyav_is_one_line_naming_the_extra(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "av", None)
    code = main(["ucf101", "--src", str(tmp_path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "Traceback" not in err
    assert err == ("protoclip ucf101: missing package: protoclip ucf101 needs the 'ucf101' extra (av is not "
                   "installed): pip install -e '.[ucf101]'")
    assert not (tmp_path / "out").exists()  # stopped before any work


def test_build_prompts_without_clip_benchmark_names_the_prompts_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "clip_benchmark", None)
    with pytest.raises(SystemExit) as stop:
        build_prompts.main(["--reference", str(tmp_path / "none.md"), "--out", str(tmp_path / "p.json")])
    assert str(stop.value) == ("missing package: build_prompts needs the 'prompts' extra (clip_benchmark is not "
                               "installed): pip install -e '.[prompts]'")


def test_without_faiss_kmeans_runs_torch_and_faiss_only_callers_name_both_extras(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "faiss", None)
    monkeypatch.setattr(kmeans_mod, "_SAID_NO_FAISS", [])
    with caplog.at_level(logging.INFO, logger=kmeans_mod.__name__):
        assert kmeans_mod.resolve_backend("auto", torch.device("cpu")) == "torch"
        assert kmeans_mod.resolve_backend("auto", torch.device("cpu")) == "torch"
    said = [r.getMessage() for r in caplog.records if "faiss is not installed" in r.getMessage()]
    assert len(said) == 1 and "torch backend" in said[0]
    expected = ("faiss k-means needs the 'cpu' or 'gpu' extra (faiss is not installed): "
                "pip install -e '.[cpu]' (or '.[gpu]')")
    with pytest.raises(MissingExtraError, match=re.escape(expected)):
        kmeans_mod.resolve_backend("faiss", torch.device("cpu"))
    x = np.random.default_rng(0).normal(size=(20, 3)).astype(np.float32)
    with pytest.raises(MissingExtraError) as err:  # NEMD's spherical k-means partition takes this path
        kmeans_labels(x, 2, n_init=1, max_iter=2, backend="faiss", spherical=True)
    assert str(err.value) == expected
