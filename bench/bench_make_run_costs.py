"""What issue-37's additions cost inside a finished ``make run``: validation while training and the model logging
(open_clip export, artifacts, registered version), read from the project's own records, not re-measured.

* validation: each episode record's ``time/validation`` (train_log.jsonl), against the episode's other phases
  (``time/train``, ``time/extract``, ``time/kmeans``, ...);
* model logging: in each train job's log, from the model's save ("saved ... model.pt") to "model registered";
* the DAG: every job's wall seconds from Snakemake's ``benchmarks/*.tsv`` (summed job-seconds: 2 jobs run at once,
  so the wall clock is about half).

    python bench/bench_make_run_costs.py --project /path/to/finished/project
"""
from __future__ import annotations

import argparse
import json
import re
from datetime import datetime
from pathlib import Path

from compare_make_runs import job_seconds, rule_of  # bench/ is the script's own folder


def stamp(line: str) -> datetime | None:
    m = re.match(r"(\d\d:\d\d:\d\d) ", line)
    return datetime.strptime(m.group(1), "%H:%M:%S") if m else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--project", default=".")
    root = Path(ap.parse_args().project)
    validation = phases = 0.0
    n_val = n_runs = 0
    for log in sorted((root / "results" / "runs").glob("*/train_log.jsonl")):
        n_runs += 1
        for line in log.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("kind") != "episode":
                continue
            for key, value in rec.items():
                if key.startswith("time/") and isinstance(value, (int, float)):
                    if key == "time/validation":
                        validation += value
                        n_val += 1
                    else:
                        phases += value
    logging, n_log = 0.0, 0
    for log in sorted((root / "logs").glob("train_*.log")):
        saved = None
        for line in log.read_text(errors="replace").splitlines():
            if "protoclip.models.checkpoint: saved" in line and line.rstrip().endswith("model.pt"):
                saved = stamp(line)
            elif "model registered in MLflow" in line and saved is not None and (t := stamp(line)):
                logging += (t - saved).total_seconds() % 86400
                n_log += 1
    jobs: dict[str, float] = {}
    for job, (wall, _cpu) in job_seconds(root).items():
        jobs[rule_of(job)] = jobs.get(rule_of(job), 0.0) + wall
    total = sum(jobs.values())
    print(f"project: {root.resolve()}  ({n_runs} runs)")
    print("job-seconds by rule (benchmarks/*.tsv): " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(jobs.items()))
          + f"; all {total:.0f}")
    print(f"episode phases other than validation: {phases:.0f} s; validation: {validation:.0f} s in {n_val} "
          f"validations = {100 * validation / phases:.2f} % of the phases")
    print(f"model logging: {logging:.0f} s in {n_log} runs")
    added = validation + logging
    print(f"validation + model logging = {added:.0f} s = {100 * added / (total - added):.2f} % of the DAG's other "
          f"job-seconds ({total - added:.0f} s)")


if __name__ == "__main__":
    main()
