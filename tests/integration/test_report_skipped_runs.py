"""A user with part of the paper's corpora: the runs whose training data is absent are skipped, with the reason, in
the tables, the claims ledger and the report's index, and get no job; the others are reported as usual."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from protoclip.cli import main
from protoclip.project import load_config
from protoclip.dag.stages import stages
from testkit import REPO
EXP = REPO / "config" / "experiments"


def project(tmp_path: Path) -> Path:
    """cc2.5m present (one shard of three), yfcc14m absent; a Table III run on the first, a Table V run on the
    second, with the paper's Table III and V targets and the claims ledger."""
    (tmp_path / "cc").mkdir()
    (tmp_path / "cc" / "00001.tar").write_bytes(b"")
    cfg = {
        "paths": {"data_dir": "data", "results_dir": "results", "mlflow_uri": f"sqlite:///{tmp_path}/mlflow.db"},
        "prepare": {"offline_sources": [], "eval_sets": [], "user_data": [
            {"name": "cc2.5m", "format": "wds", "path": f"{tmp_path}/cc/{{00000..00002}}.tar"},
            {"name": "yfcc14m", "format": "wds", "path": f"{tmp_path}/yfcc/{{00000..01399}}.tar"}]},
        "runs": {"t3_clip": {"method": "clip", "teacher": None, "data": ["cc2.5m"]},
                 "yfcc_protoclip_rn50_8ep": {"method": "protoclip", "data": ["yfcc14m"]},
                 "yfcc_clip_rn50_32ep": {"method": "clip", "teacher": None, "data": ["yfcc14m"]}},
        "targets": [str(EXP / "table_III.yaml"), str(EXP / "table_V.yaml")],
        "claims": {"files": ["claims.yaml"]},
    }
    claim = {"paper": "P", "source": "protoclip.txt", "line": 1, "where": "-", "quote": "-", "paper_value": 1.0,
             "paper_text": "+1", "direction": "positive", "magnitude": "none"}
    claims = [  # data absent / a run not configured / no run of the project can test it
        dict(claim, id="absent", target="table_V", a="RN50 ProtoCLIP", b="RN50 CLIP", columns=["Linear IN"]),
        dict(claim, id="unconfigured", target="table_III", a="ProtoCLIP", b="CLIP", columns=["ImageNet zero-shot"]),
        dict(claim, id="untestable", unavailable="no evaluation of this kind in this project")]
    (tmp_path / "claims.yaml").write_text(yaml.safe_dump({"claims": claims}))
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_runs_without_data_are_skipped_with_the_reason(tmp_path, monkeypatch):
    path = project(tmp_path)
    cfg = load_config(path)
    why = f"training data absent (yfcc14m: no file of {tmp_path}/yfcc/{{00000..01399}}.tar exists)"
    assert cfg.runs_without_data() == {"yfcc_protoclip_rn50_8ep": why, "yfcc_clip_rn50_32ep": why}
    # no job for it (nor for the teacher only it reads); the report does not wait for it
    monkeypatch.chdir(tmp_path)
    names = {s.name: s for s in stages(cfg, str(path))}
    assert "train_t3_clip" in names and not any("yfcc" in n for n in names)
    assert not any(n.startswith("teacher_") for n in names)
    assert not any("yfcc" in p for p in names["report"].inputs()["summaries"])
    assert names["prepare"].inputs()["user_data"] == [f"{tmp_path}/cc/00001.tar"]

    assert main(["report", "--config", str(path)]) == 0
    index = (tmp_path / "results" / "tables" / "index.md").read_text()
    assert f"- yfcc_protoclip_rn50_8ep: {why}" in index and f"- yfcc_clip_rn50_32ep: {why}" in index
    table_v = (tmp_path / "results" / "tables" / "table_V.md").read_text()
    row = next(line for line in table_v.splitlines() if "yfcc_protoclip_rn50_8ep:" in line)
    assert "skipped: yfcc_protoclip_rn50_8ep's training data is absent" in row
    table_iii = (tmp_path / "results" / "tables" / "table_III.md").read_text()
    row = next(line for line in table_iii.splitlines() if "t3_clip:" in line)
    assert "skipped" not in row and "no result" in row  # present data, not trained yet: an ordinary empty cell
    # the ledger: skipped where the runs' data is absent, not run where a run is not configured, unavailable where
    # nothing can test the claim; the first line counts each
    ledger = json.loads((tmp_path / "results" / "tables" / "claims.json").read_text())
    assert {c: ledger[c]["verdict"] for c in ledger} == {"absent": "skipped", "unconfigured": "not run",
                                                         "untestable": "unavailable"}
    md = (tmp_path / "results" / "tables" / "claims.md").read_text()
    assert "3 distinct claims, 1 not run, 1 skipped, 1 unavailable" in md
    assert "skipped: yfcc_protoclip_rn50_8ep's training data is absent" in md
