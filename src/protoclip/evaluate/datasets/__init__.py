"""Evaluation data sets behind one interface: every configured set (``evaluate.datasets``) opened by
:func:`load_eval_set` into a :class:`LabelledSet`, a :class:`CaptionSet` or, when its data is not configured or
not there, a :class:`Skipped` whose ``reason`` is the line tables show (never an exception, never a 0). One module
per ``kind``; broken data stops with one line naming the file: docs/evaluation-sets.md#protoclipevaluatedatasets.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from protoclip.evaluate.config import EvalDatasetConfig
from protoclip.evaluate.datasets.captions import load_captions
from protoclip.evaluate.datasets.folder import load_folder
from protoclip.evaluate.datasets.offline import (HELDOUT, HELDOUT_TEMPLATES, label_words, load_heldout_pairs,
                                                 load_offline_npz)
from protoclip.evaluate.datasets.sets import (ArraySplit, CaptionSet, EvalDataError, EvalSet, FileSplit,
                                              ImageSplit, LabelledSet, Skipped, SubsetSplit, TorchvisionSplit,
                                              WdsSplit, to_rgb)
from protoclip.evaluate.datasets.subsample import (cheap_labels, stratified_indices, subsample_indices,
                                                   subsample_set)
from protoclip.evaluate.datasets.torchvision_sets import load_torchvision
from protoclip.evaluate.datasets.wds import load_wds
from protoclip.files.layout import Layout
from protoclip.tasks import TASKS

LOADERS: dict[str, Callable[[str, Path, EvalDatasetConfig, bool], EvalSet]] = {
    "torchvision": lambda name, root, cfg, train: load_torchvision(name, root, train),
    "folder": lambda name, root, cfg, train: load_folder(name, root, train),
    "wds": lambda name, root, cfg, train: load_wds(name, root, train),
    "coco": lambda name, root, cfg, train: load_captions("coco", name, root, cfg.split),
    "flickr30k": lambda name, root, cfg, train: load_captions("flickr30k", name, root, cfg.split),
}


def load_eval_set(name: str, cfg: EvalDatasetConfig, layout: Layout, seed: int = 0,
                  tasks: Iterable[str] | None = None) -> EvalSet | Skipped:
    """Open data set ``name`` for ``tasks`` (default: its configured tasks); a path that is not configured or not
    found gives :class:`Skipped`.

    The train split of a user-path set is built only when a probe task is asked for; a copy without it keeps the
    set (``train_missing`` says why the probes are skipped). A path whose layout has no test split is reported not
    found; data that is there but wrong (a class list that does not match the prompts, a missing shard or image,
    unreadable labels) raises :class:`EvalDataError`. A labelled set's splits are cut to ``cfg.max_train`` /
    ``cfg.max_test`` (:func:`subsample_set`, seeded by ``seed`` = ``evaluate.seed`` and the set's name).

        ds = load_eval_set("cifar10", cfg.evaluate.datasets["cifar10"], Layout.from_config(cfg),
                           seed=cfg.evaluate.seed, tasks=["zeroshot"])   # no train split: no probe asked for
    """
    need_train = any(t in TASKS and TASKS[t].probe for t in (cfg.tasks if tasks is None else tasks))
    ds = _open_eval_set(name, cfg, layout, need_train)
    if isinstance(ds, LabelledSet):
        return subsample_set(ds, cfg.max_train, cfg.max_test, seed)
    return ds


def eval_data_path(name: str, cfg: EvalDatasetConfig, layout: Layout) -> Path | None:
    """Where set ``name`` is read from: its configured path, or for an offline set without one what `prepare`
    writes (the manifest for ``heldout_pairs``, ``data/prepared/eval/<name>.npz`` else); None: not configured."""
    if cfg.path:
        return Path(cfg.path).expanduser()
    if cfg.kind == "offline":
        return layout.manifest if name == HELDOUT else layout.eval_set(name)
    return None


def missing_reason(name: str, cfg: EvalDatasetConfig, layout: Layout) -> str | None:
    """Why set ``name``'s data is absent (the skip line tables show), None when it is present: the one check
    of "is this set's data here" that loading, `collect` and the workflow's DAG share."""
    path = eval_data_path(name, cfg, layout)
    if path is None:
        return f"skipped: {name} path not configured"
    return None if path.exists() else f"skipped: {name} not found at {path}"


def _open_eval_set(name: str, cfg: EvalDatasetConfig, layout: Layout, need_train: bool) -> EvalSet | Skipped:
    if (reason := missing_reason(name, cfg, layout)) is not None:
        return Skipped(name, reason)
    root = eval_data_path(name, cfg, layout)
    if cfg.kind == "offline":  # the offline default's sets: both splits, as prepare wrote them
        return load_heldout_pairs(layout, root) if name == HELDOUT else load_offline_npz(name, root)
    try:
        return LOADERS[cfg.kind](name, root, cfg, need_train)
    except (FileNotFoundError, RuntimeError) as err:  # no test split in the layout (torchvision: "Dataset not found")
        return Skipped(name, f"skipped: {name} not found at {root} ({err})")


__all__ = [
    "HELDOUT", "HELDOUT_TEMPLATES", "ArraySplit", "CaptionSet", "EvalDataError", "EvalSet",
    "FileSplit", "ImageSplit", "LabelledSet", "Skipped", "SubsetSplit", "TorchvisionSplit", "WdsSplit", "cheap_labels",
    "eval_data_path", "label_words", "load_eval_set", "load_heldout_pairs", "load_offline_npz", "missing_reason",
    "stratified_indices", "subsample_indices", "subsample_set", "to_rgb",
]
