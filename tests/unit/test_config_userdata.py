"""Your own data only: a config whose data or evaluation columns resolve to nothing stops when it loads, one line naming
the key, instead of a pyarrow traceback in training (no source) or an empty table column (no set)."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from protoclip.cli import main
from protoclip.errors import ConfigError
from protoclip.project import load_config


def write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def user_only(tmp_path: Path, run: dict, **extra) -> dict:
    """prepare: user shards only (img2dataset output, as in the issue), no offline source; one run."""
    return {"paths": {"data_dir": str(tmp_path / "data"), "results_dir": str(tmp_path / "results")},
            "prepare": {"offline_sources": [], "eval_sets": [],
                        "user_data": [{"name": "mine", "format": "wds", "path": str(tmp_path / "{00000..00002}.tar")}]},
            "runs": {"r": run}, **extra}


def test_user_shards_only_and_default_train_data_stops_at_load_naming_the_key(tmp_path, capsys):
    conf = write(tmp_path / "config.yaml", user_only(tmp_path, {"method": "clip"}))
    with pytest.raises(ConfigError) as err:
        load_config(conf)
    msg = str(err.value)
    assert "run 'r'" in msg and "train.data" in msg and "prepare.offline_sources is empty" in msg
    assert "(mine)" in msg  # the sources there are
    # through the CLI: exit 2, one line, no traceback; before any stage runs
    assert main(["prepare", "--config", str(conf)]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("protoclip prepare: config error: ") and "train.data" in lines[0]
    assert not (tmp_path / "data").exists()


def test_user_shards_only_with_train_data_naming_them_loads(tmp_path):
    cfg = load_config(write(tmp_path / "config.yaml", user_only(tmp_path, {"method": "clip", "data": ["mine"]})))
    assert cfg.run("r").data == ["mine"]
    # a released checkpoint trains on nothing here: the default data is not checked for it
    pre = load_config(write(tmp_path / "pre.yaml", user_only(tmp_path, {"method": "clip", "pretrained": {
        "model": "RN50", "tag": "yfcc15m"}})))
    assert pre.run("r").pretrained.enabled and pre.run("r").data == ["offline"]

def test_empty_train_data_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"run 'r': train\.data is empty \(sources prepared by .*: mine\)"):
        load_config(write(tmp_path / "config.yaml", user_only(tmp_path, {"method": "clip", "data": []})))


def test_with_offline_sources_the_default_still_loads(tmp_path):
    data = user_only(tmp_path, {"method": "clip"})
    data["prepare"]["offline_sources"] = ["emoji"]
    assert load_config(write(tmp_path / "config.yaml", data)).run("r").data == ["offline"]


def _with_target(tmp_path: Path, column: dict) -> Path:
    exp = write(tmp_path / "exp.yaml", {
        "target": {"id": "t_mine", "kind": "table", "caption": "mine", "paper": "-",
                   "rows": [{"label": "CLIP", "run": "r"}],
                   "columns": [{"label": "Mine zero-shot", "task": "zeroshot", "metric": "top1", **column}]},
        "runs": {"r": {"method": "clip", "data": ["mine"]}}})
    data = user_only(tmp_path, {"method": "clip", "data": ["mine"]},
                     evaluate={"datasets": {"heldout_pairs": {"kind": "offline"}}}, experiments=[exp.name])
    del data["runs"]
    return write(tmp_path / "config.yaml", data)


def test_a_column_whose_sets_are_not_under_evaluate_datasets_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(_with_target(tmp_path, {"datasets": ["mine_test"], "offline": ["cifar10"]}))
    msg = str(err.value)
    assert "target 't_mine'" in msg and "column 'Mine zero-shot'" in msg and "['mine_test', 'cifar10']" in msg
    assert "evaluate.datasets" in msg and "(defined: heldout_pairs)" in msg and "\n" not in msg
    # one of its sets defined (here the stand-in): the column has an evaluation, the config loads
    cfg = load_config(_with_target(tmp_path, {"datasets": ["mine_test"], "offline": ["heldout_pairs"]}))
    assert [t.id for t in cfg.paper_targets()] == ["t_mine"]
