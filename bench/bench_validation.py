"""Cost of validation while training (``train.validation``) and of logging the model to MLflow, on the offline
default, measured side by side in one training process.

One run of the offline default (default ``t3_clip``: CLIP, tiny-rn, batch 128, m = 1024) is trained as a Snakemake
job runs it (one thread), on the real prepared corpus (``data/prepared``, from ``protoclip prepare``), with the real
stage (:func:`protoclip.train.stage.run_train`) into a temporary results folder and MLflow store, validating after
EVERY episode (the set, tasks and sizes of the run's configured validation): each episode record then holds its
training phases' seconds and the validation's, taken alternately under the same load. The validator's set-up and
the model logging (open_clip export, artifacts, registered version) are timed once.

The whole ``make run`` cost is then counted from the config: every run's episodes (its schedule) and the
validations its own ``validation`` settings give; its training time is taken as the measured CLIP episode time per
episode (a lower bound: ProtoCLIP episodes add extraction and k-means), so the share printed is an upper bound.

    python bench/bench_validation.py --project /path/with/data/prepared     # ~3 min on a busy 2-core machine
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--project", default=".", help="folder with config/config.yaml and data/prepared")
    ap.add_argument("--run", default="t3_clip")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    import yaml

    from protoclip.project import load_config
    from protoclip.data.loading.pairs import load_manifest
    from protoclip.files.layout import Layout
    from protoclip.files.records import read_train_log
    from protoclip.tracking import training_run
    from protoclip.train.episode import episode_size_for
    from protoclip.train.schedule import n_episodes
    from protoclip.data.loading.training_set import resolve_sources
    from protoclip.models.export_openclip import export_or_copy
    from protoclip.tracking import log_model
    from protoclip.train.stage import provenance_tags, run_train
    from protoclip.train.validation import due

    project = Path(args.project).resolve()
    config = project / "config" / "config.yaml"
    base = load_config(config)
    with tempfile.TemporaryDirectory(prefix="bench-validation-") as tmp:
        data = yaml.safe_load(config.read_text())
        data["paths"].update(data_dir=str(project / base.paths.data_dir), results_dir=f"{tmp}/results",
                             mlflow_uri=f"sqlite:///{tmp}/mlflow.db")
        data.setdefault("runs", {})
        cfg_file = project / "config" / f".bench_validation_{os.getpid()}.yaml"
        cfg_file.write_text(yaml.safe_dump(data))
        try:
            cfg = load_config(cfg_file, overrides={"train_force": {"validation": {"every_episodes": 1}}})
        finally:
            cfg_file.unlink()
        layout = Layout.from_config(cfg)
        t0 = time.perf_counter()
        run_train(cfg, args.run)
        wall = time.perf_counter() - t0
        episodes = read_train_log(layout.train_log(args.run), kind="episode")
        train_s = [sum(v for k, v in r.items() if k.startswith("time/") and k != "time/validation") for r in episodes]
        val_s = [r["time/validation"] for r in episodes]
        t0 = time.perf_counter()
        with training_run(cfg.paths, f"{args.run}-model-logging", None, []) as tracker:
            log_model(tracker, layout.model(args.run), f"{args.run}-model-logging",
                      provenance_tags({}, "", "bench"), export_or_copy)
        log_s = time.perf_counter() - t0
        from protoclip.models import get_tokenizer, load_model
        from protoclip.train.validation import build_validator

        model, _ = load_model(layout.model(args.run))
        t0 = time.perf_counter()
        build_validator(cfg.evaluate, layout, cfg.run(args.run), model.image_size,
                        get_tokenizer(model.name, context_length=model.context_length))
        setup_s = time.perf_counter() - t0

    # the offline default as `make run` trains it: each run's episodes and its configured validations
    manifest = load_manifest(Layout.from_config(base), split="train", columns=["id", "source"])
    schedules = []  # (episodes, the run's validation settings)
    for name in base.run_names():
        tcfg = base.run(name)
        M = int(manifest["source"].isin(resolve_sources(tcfg.data, base.prepare.offline_sources)).sum())
        M = max(1, int(-(-tcfg.subset_fraction * M // 1))) if tcfg.subset_fraction < 1 else M
        schedules.append((n_episodes(tcfg.epochs, M, episode_size_for(tcfg.episode_size, M)), tcfg.validation))
    total_ep = sum(n for n, _ in schedules)

    def validations(every: int | None) -> int:  # None: each run's own setting
        return sum(due(v if every is None else replace(v, every_episodes=every), e, n, False)
                   for n, v in schedules for e in range(n))

    ep, val = statistics.median(train_s), statistics.median(val_s)
    vcfg = base.run(args.run).validation
    print(f"# bench_validation.py, run {args.run}, one thread, load average {os.getloadavg()[0]:.1f} at the end")
    print(f"validation: {vcfg.dataset} {vcfg.tasks}, max_images {vcfg.max_images}; default every "
          f"{vcfg.every_episodes} episodes")
    print(f"training {len(episodes)} episodes (each followed by a validation): {wall:.1f} s wall")
    print(f"  per episode, training phases: median {ep:.2f} s  ({', '.join(f'{x:.2f}' for x in train_s)})")
    print(f"  per validation:               median {val:.2f} s  ({', '.join(f'{x:.2f}' for x in val_s)})")
    print(f"validator set-up (read, decode and transform the set), once per run: {setup_s:.2f} s")
    print(f"model logging (open_clip export + artifacts + registered version), once: {log_s:.2f} s")
    print(f"offline default ({len(base.run_names())} runs, {total_ep} episodes), validation (set-up included) / "
          "training time, an upper bound (the CLIP episode time taken for every run's episodes):")
    for every in (None, 2, 4, 8, 16):
        n_val = validations(every)
        share = (n_val * val + len(base.run_names()) * setup_s) / (total_ep * ep)
        print(f"  every {'(config)' if every is None else every:>8}: {n_val:4d} validations  <= {100 * share:.2f} %")
    print(f"  model logging / training time <= {100 * len(base.run_names()) * log_s / (total_ep * ep):.2f} %")


if __name__ == "__main__":
    main()
