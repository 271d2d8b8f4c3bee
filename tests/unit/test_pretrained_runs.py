"""Runs that evaluate a released checkpoint (``pretrained:``): the keys checked at load (one line naming the key),
the tags read without importing open_clip, and the DAG planning evaluate + collect for them and no training."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from protoclip.config.architectures import released_tags
from protoclip.dag.stages import exportable_runs, pretrained_settings, stages
from protoclip.errors import ConfigError
from protoclip.project import load_config
from testkit import REPO


def write(tmp_path: Path, runs: dict, **extra) -> Path:
    config = {"paths": {"data_dir": str(tmp_path / "data"), "results_dir": str(tmp_path / "results")},
              "train": {"model": "tiny-rn", "teacher": None},
              "evaluate": {"datasets": {"heldout_pairs": {"kind": "offline"}}}, "runs": runs, **extra}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_released_tags_are_open_clips_list():
    import open_clip

    tags = released_tags()
    assert sorted((m, t) for m, ts in tags.items() for t in ts) == sorted(open_clip.list_pretrained())
    assert "yfcc15m" in tags["RN50"] and "yfcc15m" in tags["RN101"] and "yfcc15m" in tags["RN50-quickgelu"]


@pytest.mark.parametrize("pretrained, method, says", [
    ({"model": "RN5O", "tag": "yfcc15m"}, "clip", "pretrained.model: unknown model 'RN5O'"),
    ({"model": "RN101", "tag": "cc12m"}, "clip", "pretrained.tag: 'cc12m' is not a released checkpoint of open_clip "
                                                 "model 'RN101' (its tags: openai, yfcc15m)"),
    ({"tag": "yfcc15m"}, "clip", "pretrained.model: no model given"),
    ({"model": "RN50"}, "clip", "pretrained.model 'RN50' needs a tag"),
    ({"model": "RN50", "tag": "local-dir:/x"}, "clip", "pretrained.model must be null with tag 'local-dir:/x'"),
    ({"tag": "local-dir:"}, "clip", "pretrained.tag 'local-dir:': no folder after 'local-dir:'"),
    ({"model": "RN50", "tag": "yfcc15m"}, "protoclip", "scored as CLIP: set method: clip (got protoclip)"),
    ({"model": "RN50", "tag": "yfcc15m", "epochs": 32}, "clip", "unknown key 'pretrained.epochs'"),
])
def test_a_bad_pretrained_section_stops_at_load_naming_the_key(tmp_path, pretrained, method, says):
    path = write(tmp_path, {"released": {"method": method, "pretrained": pretrained}})
    with pytest.raises(ConfigError) as err:
        load_config(path)
    text = str(err.value)
    assert says in text and str(path) in text and "released" in text and "\n" not in text


def test_released_runs_get_evaluate_and_collect_but_no_training(tmp_path):
    path = write(tmp_path, {"trained": {"method": "clip", "data": ["absent"]},
                            "released": {"method": "clip", "data": ["absent"],
                                         "pretrained": {"model": "RN50", "tag": "yfcc15m"}},
                            "exported": {"method": "clip", "pretrained": {"tag": f"local-dir:{tmp_path / 'exp'}"}}},
                 prepare={"user_data": [{"name": "absent", "format": "csv", "path": str(tmp_path / "none.csv")}]})
    cfg = load_config(path)  # the local-dir folder need not exist yet (an export of the same DAG)
    assert set(cfg.runs_without_data()) == {"trained"}  # its data is absent; a released checkpoint needs none
    plan = {s.name: s for s in stages(cfg, str(path))}
    for run in ("released", "exported"):
        assert f"train_{run}" not in plan and f"collect_{run}" in plan
        evaluate = plan[f"evaluate_{run}_heldout_pairs"]
        assert evaluate.deps["model"] == []  # no model.pt; a tag is fetched, a missing folder stops the job
        assert evaluate.args == f"--run {run} --dataset heldout_pairs"
        assert {f"runs.{run}"} <= {k for p in evaluate.params for keys in p.values() for k in keys}
    assert not any(Path(p).parent.name in ("released", "exported") for p in plan["report"].deps["train_logs"])
    assert "released" not in exportable_runs(cfg) and "exported" not in exportable_runs(cfg)
    # Snakemake's evaluation settings digest: the checkpoint a released run names; nothing new for a trained run
    assert pretrained_settings(cfg, "released") == {"pretrained": {"model": "RN50", "tag": "yfcc15m"}}
    assert pretrained_settings(cfg, "trained") == {}
    from protoclip.report.values import Results

    assert Results(cfg).epoch_cell("released", "trained").text == "32 (released checkpoint)"  # no train log to time

    (tmp_path / "exp").mkdir()  # once the folder is there it is the evaluation's input (a new export reruns it)
    plan = {s.name: s for s in stages(load_config(path), str(path))}
    assert plan["evaluate_exported_heldout_pairs"].deps["model"] == [str(tmp_path / "exp")]


def test_the_paper_config_evaluates_openclips_yfcc_checkpoints_without_importing_torch():
    cfg = load_config(REPO / "config" / "paper.yaml")
    for run, model in (("yfcc_clip_rn50_32ep", "RN50"), ("yfcc_clip_rn101_32ep", "RN101")):
        rc = cfg.run(run)
        assert (rc.method, rc.pretrained.model, rc.pretrained.tag, rc.epochs) == ("clip", model, "yfcc15m", 32)
        assert run not in cfg.runs_without_data()
    names = {s.name for s in stages(cfg, "config/paper.yaml")}
    assert {"collect_yfcc_clip_rn50_32ep", "collect_yfcc_clip_rn101_32ep"} <= names
    assert not {n for n in names if n.startswith("train_yfcc_clip")}
    code = ("import sys; from protoclip.project import load_config; load_config('config/paper.yaml'); "
            "assert 'torch' not in sys.modules and 'open_clip' not in sys.modules, 'imported'")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
