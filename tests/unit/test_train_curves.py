"""The MLflow naming of the train records (protoclip.train.curves): per-step train/*, the episode's numbers under
episode/ and val/* at the step count at its end, counters never metrics, K a param, one batch per episode."""
from __future__ import annotations

import math

import pytest

from protoclip.tracking import Tracker
from protoclip.train.curves import Curves, episode_metrics, step_metrics

STEP = {"kind": "step", "step": 7, "episode": 1, "epoch": 0.35, "lr": 2.5e-4, "image_lr": 0.0, "loss": 3.25,
        "grad_norm": 1.5, "clip": 2.0, "proto": 1.25, "clip_acc": 12.5, "tau_clip": 0.07, "tau_proto": 0.05}
EPISODE = {"kind": "episode", "episode": 1, "step": 8, "n_steps": 4, "mean/loss": 3.0, "mean/lr": 2e-4,
           "mean/epoch": 0.3, "k": 20.0, "kmeans_image_objective": 0.5, "time/train": 1.5, "val/zeroshot/top1": 0.25,
           "time/validation": 0.75}


def test_a_step_record_is_train_keys_and_the_logit_scales():
    got = step_metrics(STEP)
    assert got == {"train/lr": 2.5e-4, "train/image_lr": 0.0, "train/loss": 3.25, "train/grad_norm": 1.5,
                   "train/clip": 2.0, "train/proto": 1.25, "train/clip_acc": 12.5, "train/tau_clip": 0.07,
                   "train/tau_proto": 0.05, "train/logit_scale": pytest.approx(1 / 0.07),
                   "train/proto_logit_scale": pytest.approx(20.0)}
    # CLIP's init: tau = 0.07, exp(logit_scale) = 14.2857...
    assert got["train/logit_scale"] == pytest.approx(math.exp(math.log(1 / 0.07)))


def test_an_episode_record_is_episode_keys_val_as_it_is_and_no_counter():
    assert episode_metrics(EPISODE) == {"episode/mean/loss": 3.0, "episode/mean/lr": 2e-4,
                                        "episode/kmeans_image_objective": 0.5, "episode/time/train": 1.5,
                                        "val/zeroshot/top1": 0.25, "episode/time/validation": 0.75}


class Recorder(Tracker):
    def __init__(self):
        self.params, self.batches = [], []

    def log_params(self, params):
        self.params.append(params)

    def log_curves(self, rows):
        self.batches.append(rows)


def test_an_episode_is_one_batch_at_global_steps_and_k_is_a_param_once():
    rec = Recorder()
    curves = Curves(rec)
    for step in (6, 7):
        curves.add({**STEP, "step": step})
    curves.end_episode(EPISODE)
    curves.add({**STEP, "step": 8})
    curves.end_episode({**EPISODE, "episode": 2, "step": 9})
    assert [[row[0] for row in batch] for batch in rec.batches] == [[6, 7, 8], [8, 9]]
    assert rec.batches[0][2][2] == episode_metrics(EPISODE) and rec.batches[0][0][2] == step_metrics(STEP)
    assert rec.params == [{"episode": {"k": 20}}]  # a whole number, once per training call


def test_a_rank_other_than_0_logs_nothing():
    rec = Recorder()
    curves = Curves(rec, enabled=False)
    curves.add(STEP)
    curves.end_episode(EPISODE)
    assert rec.batches == [] and rec.params == []
