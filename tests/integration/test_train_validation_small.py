"""Validation while training on a held-out slice too small to score (the paper config's 0.4 % of a miniature
corpus): training goes on without curves and the log says why, where it used to stop the run."""
from __future__ import annotations

import logging

from protoclip import models
from protoclip.evaluate.config import EvalDatasetConfig
from protoclip.files.layout import Layout
from protoclip.train.config import TrainConfig, ValidationConfig
from protoclip.train.validation import build_validator
from testkit.evaluation import eval_project
from testkit.training import write_pairs


def validator_for(tmp_path, heldout: int):
    cfg = eval_project(tmp_path, {"heldout_pairs": EvalDatasetConfig(kind="offline")})
    write_pairs(Layout.from_config(cfg), n=12, heldout=heldout, size=16, images="gray", captions="numbered",
                labels=["animals", "food"])
    tcfg = TrainConfig(method="clip", validation=ValidationConfig(every_episodes=1, dataset="heldout_pairs",
                                                                  tasks=["retrieval"]))
    model = models.build_model("tiny-rn", head_hidden=32, head_out=16)
    return build_validator(cfg.evaluate, Layout.from_config(cfg), tcfg, model.image_size, tokenizer=models.get_tokenizer("tiny-rn")), model


def test_a_held_out_slice_too_small_leaves_training_without_curves(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        validator, _ = validator_for(tmp_path / "one", heldout=1)
    assert validator is None
    assert any("no validation while training (heldout_pairs is too small to score" in r.getMessage()
               for r in caplog.records)
    validator, model = validator_for(tmp_path / "four", heldout=4)  # enough: curves
    out = validator(model)
    recalls = [v for k, v in out.items() if k.startswith("val/retrieval/")]
    assert recalls and all(0.0 <= v <= 100.0 for v in recalls), out
