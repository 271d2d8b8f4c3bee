"""Feature files stay out of DVC unless evaluate.track_features asks: by default no stage lists them (and they lie
in no stage's output folder); with the switch each evaluation stage lists its set's file as a persisted, cached
out that is no Snakemake output (Snakemake would delete it before the job, and with it the extraction's cache)."""
from __future__ import annotations

from pathlib import Path

import yaml

from protoclip.project import load_config
from protoclip.dag.stages import stages
from protoclip.files.layout import Layout


def _stages(tmp_path: Path, **evaluate) -> tuple[list, Layout]:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({
        "paths": {"data_dir": str(tmp_path / "data"), "results_dir": str(tmp_path / "results")},
        "runs": {"r": {"method": "clip"}},
        "evaluate": {**evaluate, "datasets": {"digits": {"kind": "offline", "tasks": ["knn"]}}},
    }))
    cfg = load_config(path)
    return [s for s in stages(cfg, str(path)) if s.name.startswith("evaluate_")], Layout.from_config(cfg)


def test_features_are_no_dvc_out_by_default_and_a_persisted_one_when_tracked(tmp_path):
    plain, layout = _stages(tmp_path, extract_chunk_batches=4)
    assert [s.name for s in plain] == ["evaluate_r_digits"]
    features = layout.features("r", "digits")
    outs = [Path(next(iter(o)) if isinstance(o, dict) else o) for o in plain[0].dvc()["outs"]]
    assert outs == [layout.eval_dir("r", "digits")]
    assert all(o not in features.parents for o in outs)  # not inside the cached evaluation folder either
    assert layout.eval_progress("r", "digits").parent.parent == layout.checkpoint("r").parent
    # the chunking changes no number: no DVC param (else changing it would rerun every evaluation)
    assert not any("extract_chunk_batches" in str(p) for p in plain[0].params)

    tracked, _ = _stages(tmp_path, track_features=True)
    dvc = tracked[0].dvc()
    assert dvc["outs"][:-1] == plain[0].dvc()["outs"] and dvc["outs"][-1] == {str(features): {"persist": True}}
    assert [t.path for t in tracked[0].targets.values()] == [str(layout.eval_dir("r", "digits"))]
    assert tracked[0].cmd == plain[0].cmd and not any("track_features" in str(p) for p in tracked[0].params)
