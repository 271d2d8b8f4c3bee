"""Validation while training, its settings: which episodes end with one, what the config refuses (with the key and
file named), and the provenance digest of a run's config."""
from __future__ import annotations

import hashlib
import json

import pytest
import yaml

from protoclip.project import load_config
from protoclip.errors import ConfigError
from protoclip.evaluate.datasets import HELDOUT
from protoclip.train.config import HELDOUT_SET, ValidationConfig
from protoclip.train.validation import due


def episodes_validated(every: int, n: int, stop_at: int | None = None) -> list[int]:
    end = n if stop_at is None else stop_at + 1
    return [e for e in range(end) if due(ValidationConfig(every_episodes=every), e, n, e == stop_at)]


def test_every_nth_episode_and_the_last_one():
    assert episodes_validated(4, 9) == [3, 7, 8]
    assert episodes_validated(8, 17) == [7, 15, 16]
    assert episodes_validated(8, 16) == [7, 15]  # the last one is a multiple: validated once
    assert episodes_validated(8, 5) == [4]  # a short run: its final model only
    assert episodes_validated(1, 3) == [0, 1, 2]
    assert episodes_validated(0, 9) == []  # off
    assert episodes_validated(4, 20, stop_at=5) == [3, 5]  # an early stop at episode 5 ends with a validation


def test_the_held_out_set_is_spelled_as_the_evaluation_names_it():
    assert HELDOUT_SET == HELDOUT


def config(tmp_path, validation: dict, datasets: dict | None = None):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"evaluate": {"datasets": datasets or {}},
                                    "runs": {"r": {"method": "clip", "teacher": None, "validation": validation}}}))
    return path


def test_an_unknown_validation_set_or_task_stops_the_config(tmp_path):
    with pytest.raises(ConfigError, match=r"run 'r': validation.dataset 'cifar10' is not a set of evaluate.datasets"):
        load_config(config(tmp_path, {"dataset": "cifar10"}))
    with pytest.raises(ConfigError, match=r"validation.tasks must be a non-empty list of zeroshot, knn, retrieval"):
        load_config(config(tmp_path, {"tasks": ["linear"]}))
    with pytest.raises(ConfigError, match=r"every_episodes must be >= 0"):
        load_config(config(tmp_path, {"every_episodes": -1}))
    # a configured set, the held-out pairs without an entry, or validation off: accepted
    assert load_config(config(tmp_path, {"dataset": "digits"}, {"digits": {"kind": "offline"}})).run(
        "r").validation.dataset == "digits"
    assert load_config(config(tmp_path, {})).run("r").validation.dataset == "heldout_pairs"
    assert load_config(config(tmp_path, {"dataset": "cifar10", "every_episodes": 0})).run("r").validation.every_episodes == 0


def test_validation_settings_do_not_block_a_resume():
    from protoclip.config.strict import to_dict
    from protoclip.train.checkpoint import resume_key
    from protoclip.train.config import TrainConfig

    a, b = TrainConfig(method="clip", teacher=None), TrainConfig(method="clip", teacher=None)
    b.validation.every_episodes = 1  # validation changes no weight (it runs in a forked RNG, in eval mode)
    assert resume_key(to_dict(a)) == resume_key(to_dict(b))


def test_provenance_tags_digest_the_config_as_canonical_json():
    from protoclip.train.stage import provenance_tags

    config = {"name": "r", "lr": 0.001, "loss": {"tau_y": 0.01, "pbt": True}}
    reordered = {"loss": {"pbt": True, "tau_y": 0.01}, "lr": 0.001, "name": "r"}
    canonical = '{"loss": {"pbt": true, "tau_y": 0.01}, "lr": 0.001, "name": "r"}'
    tags = provenance_tags(config, "d" * 64, "m" * 64)
    assert tags["protoclip.config_sha256"] == hashlib.sha256(canonical.encode()).hexdigest()
    assert tags == provenance_tags(reordered, "d" * 64, "m" * 64)
    assert json.loads(canonical) == config
    assert (tags["protoclip.data_digest"], tags["protoclip.model_sha256"]) == ("d" * 64, "m" * 64)
