"""`protoclip report` turns metrics files into tables and figures, showing skipped sets as such."""
import json

import pandas as pd
import yaml

from protoclip.project import load_config
from protoclip.files.layout import Layout
from protoclip.report.stage import run_report
from protoclip.report.tables import collect_metrics, task_table
from protoclip.report.values import Results
from protoclip.tasks import TaskStatus
from testkit.results import mark_evaluated


def make_project(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({"runs": {"a": {"method": "clip"}, "b": {"method": "clip"}}}))
    conf = tmp_path / "config.yaml"
    conf.write_text(yaml.safe_dump({"paths": {"data_dir": str(tmp_path / "data"),
                                              "results_dir": str(tmp_path / "results")},
                                    "experiments": [exp.name]}))
    cfg = load_config(conf)
    lay = Layout.from_config(cfg)
    values = {"a": 12.5, "b": 20.0}
    for run, top1 in values.items():
        for task, metrics in {"zeroshot": {"top1": top1, "top5": 2 * top1}, "clustering": {"ari": 0.1, "ami": 0.2}}.items():
            path = lay.metrics(run, task, "digits")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"metrics": metrics, "run": run}))
        skip = lay.metrics(run, "zeroshot", "cifar10")
        skip.parent.mkdir(parents=True, exist_ok=True)
        skip.write_text(json.dumps({"skipped": "skipped: cifar10 not found at /nope", "status": {
            "state": "missing", "reason": "skipped: cifar10 not found at /nope"}}))
        log = lay.train_log(run)
        log.write_text("\n".join(json.dumps({"kind": "step", "step": s, "loss": 5.0 - s}) for s in range(3))
                       + "\n" + json.dumps({"kind": "episode", "episode": 0}) + "\n")
    mark_evaluated(lay.results_dir)
    return cfg, lay


def test_tables_hold_the_metrics_files_values(tmp_path):
    cfg, lay = make_project(tmp_path)
    long = collect_metrics(Results(cfg), ["a", "b"])
    table, skipped = task_table(long, "zeroshot")
    assert table.loc[("digits", "top1"), "a"] == "12.5" and table.loc[("digits", "top5"), "b"] == "40"
    assert skipped == ["skipped: cifar10 not found at /nope"]  # listed once in the index, not as a row
    assert list(table.index) == [("digits", "top1"), ("digits", "top5")]


def test_run_report_writes_every_format_and_the_loss_plot(tmp_path):
    cfg, lay = make_project(tmp_path)
    index = run_report(cfg)
    text = index.read_text()
    assert text.count("skipped: cifar10 not found at /nope") == 1  # once, at the top of the index
    assert "skipped" not in (lay.tables / "zeroshot.md").read_text()
    assert "skipped: cifar10" in (lay.tables / "metrics_long.csv").read_text()
    for ext in ("csv", "md", "tex"):
        assert (lay.tables / f"zeroshot.{ext}").stat().st_size > 0
        assert (lay.tables / f"clustering.{ext}").stat().st_size > 0
    losses = pd.read_csv(lay.tables / "train_loss.csv")
    assert list(losses.columns) == ["run", "step", "loss"] and len(losses) == 6  # episode lines excluded
    assert (lay.figures / "train_curves.png").read_bytes()[:4] == b"\x89PNG"


def test_not_applicable_cells_read_na_and_stay_out_of_the_skipped_list(tmp_path):
    # an image-only run's zero-shot is "not applicable" (a property of the run): its cell says so, and the index's
    # skipped-data-set list holds only sets that are missing, not the run's inapplicable tasks
    from protoclip.report.paper_targets import ColumnConfig

    cfg, lay = make_project(tmp_path)
    for task in ("zeroshot", "clustering"):
        status = TaskStatus(TaskStatus.NOT_APPLICABLE, "image-only method (pcl)", "the text tower is untrained")
        lay.metrics("b", task, "digits").write_text(json.dumps(
            {"run": "b", "task": task, "skipped": status.line, "status": status.record()}))
    mark_evaluated(lay.results_dir)  # as the evaluation that wrote them does last
    res = Results(cfg)
    zs = ColumnConfig(label="zero-shot", task="zeroshot", datasets=["digits"])
    assert res.cell("b", zs, ["digits"]).fmt() == "n/a: image-only method (pcl)"
    assert res.cell("a", zs, ["digits"]).fmt() == "12.50 (1 seed)"
    assert res.cell("a", zs, ["cifar10"]).fmt() == "no result"  # a missing set stays "no result"
    assert res.skipped() == {"cifar10": "skipped: cifar10 not found at /nope"}
