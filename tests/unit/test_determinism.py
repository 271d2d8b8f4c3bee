"""Same weights -> same bytes: model.pt and checkpoints do not depend on temp-file names (DVC, content stores)."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from protoclip.files.atomic import save_torch
from protoclip.files.layout import Layout
from testkit.training import RandomPairs, one_thread, tiny_config, tiny_model

_threads = pytest.fixture(autouse=True)(one_thread)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_save_torch_is_byte_identical_and_loads_back(tmp_path):
    obj = {"w": torch.arange(12.0).reshape(3, 4), "meta": {"episode": 3, "name": "x"}}
    a, b = save_torch(tmp_path / "a.pt", obj), save_torch(tmp_path / "sub" / "b.pt", obj)
    assert sha(a) == sha(b)
    back = torch.load(a, weights_only=True)
    assert torch.equal(back["w"], obj["w"]) and back["meta"] == obj["meta"]
    torch.save(obj, tmp_path / "plain.pt")  # what it replaces: the archive records carry the file's name
    torch.save(obj, tmp_path / "other.pt")
    assert sha(tmp_path / "plain.pt") != sha(tmp_path / "other.pt")
    assert not list(tmp_path.glob(".*.tmp*"))  # atomic: no temp file left


def test_two_identical_trainings_give_identical_files(tmp_path):
    from protoclip.models import save_model
    from protoclip.train.loop import train

    cfg = tiny_config(method="clip", epochs=1.0)
    digests = []
    for name in ("a", "b"):
        layout = Layout(tmp_path / name / "data", tmp_path / name / "results")
        model = train(tiny_model(cfg), RandomPairs(n=32), cfg, layout.train_files("run"))
        save_model(layout.model("run"), model, {"lr": cfg.lr})
        digests.append((sha(layout.model("run")), sha(layout.checkpoint("run"))))
    assert digests[0] == digests[1]
