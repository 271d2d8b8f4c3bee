"""What the claims ledger resamples of one evaluation: a metric's resampling units from the per-example arrays the
evaluation kept beside its metrics file (``<task>.examples.npz``), a score's chance level and a clustering
score's spread over its k-means initialisations. The kind of arrays a task keeps is its ``Task.examples``
(protoclip.tasks): "hits" (a hit per test image), "ranks" (a first-match rank per retrieval query), "clusters"
(a k-means assignment per image).
"""
from __future__ import annotations

import re

import numpy as np

from protoclip.claims import ledger
from protoclip.claims.bootstrap import MutualInfo, RandIndex, Units
from protoclip.tasks import TASKS

RECALL = re.compile(r"(image_to_text|text_to_image)_R@(\d+)")


def examples_kind(task: str) -> str:
    """The per-example arrays ``task`` keeps (``Task.examples``); "" for a task that keeps none or is unknown."""
    return TASKS[task].examples if task in TASKS else ""


def metric_units(task: str, metric: str, examples: dict[str, np.ndarray],
                 workers: int = 1) -> Units | RandIndex | MutualInfo | None:
    """The resampling units of ``metric`` from a task's per-example arrays (records.read_examples, of the task's
    kind :func:`examples_kind`); None when the metric has no resampling unit here (AMI, NEMD, ...). With every unit
    drawn once it is the metrics file's number. "clusters" ``ari`` / ``ami``: the test images with their fixed
    k-means assignments (:class:`RandIndex`, :class:`MutualInfo`, whose resamples use ``workers`` processes).

    "hits" ``top1`` / ``top5`` (zero-shot, linear, kNN): the mean hit of the test images; "ranks" ``<dir>_R@k``
    and ``mean_recall`` (retrieval): units are the images, each with its captions (image queries: hit or not;
    caption queries: the image's captions hit, over its number of captions), so an image is drawn together with
    its captions."""
    kind = examples_kind(task)
    if kind == "hits":
        return Units.mean(examples[metric]) if metric in ("top1", "top5") and metric in examples else None
    if kind == "clusters":
        if "cluster" not in examples or metric not in ("ari", "ami"):
            return None
        if metric == "ami":
            return MutualInfo(examples["cluster"], examples["labels"], workers=workers)
        return RandIndex(examples["cluster"], examples["labels"])
    if kind != "ranks" or "image_to_text_rank" not in examples:
        return None
    owner = np.asarray(examples["text_to_image"])
    n_img = len(examples["image_to_text_rank"])
    captions = np.bincount(owner, minlength=n_img).astype(np.float64)

    def term(direction: str, k: int) -> tuple[np.ndarray, np.ndarray]:
        hit = examples[f"{direction}_rank"] < k
        if direction == "image_to_text":
            return hit.astype(np.float64), np.ones(n_img)
        return np.bincount(owner, weights=hit, minlength=n_img), captions

    if (m := RECALL.fullmatch(metric)) is not None:
        num, den = term(m.group(1), int(m.group(2)))
        return Units(num[None], den[None], np.array([100.0]))
    if metric == "mean_recall":  # the mean of the six recalls at k = 1, 5, 10 (metrics.retrieval)
        terms = [term(d, k) for d in ("image_to_text", "text_to_image") for k in (1, 5, 10)]
        return Units(np.stack([t[0] for t in terms]), np.stack([t[1] for t in terms]), np.full(6, 100.0 / 6))
    return None


def chance_of(task: str, metric: str, examples: dict[str, np.ndarray], metrics: dict) -> tuple[float, str]:
    """(chance level of ``metric`` in its unit, from what): the class count is the metrics file's
    ``n_classes`` (zero-shot: the classifier's classes) or the distinct labels of the test examples (a probe
    predicts the classes it was trained on); the candidates of a recall are the test images (an image's captions
    are one target: a caption query has one image among N, an image query its captions among N images')."""
    if metric in ("ari", "ami"):
        return 0.0, "0 for a chance-adjusted score"
    if examples_kind(task) == "ranks":
        n = int(len(examples["image_to_text_rank"]))
        return ledger.chance_level(metric, candidates=n), f"{n} candidates"
    if "n_classes" in metrics:
        n, what = int(metrics["n_classes"]), "classes of the classifier"
    else:
        n, what = int(len(np.unique(examples["labels"]))), "classes in the test labels"
    return ledger.chance_level(metric, classes=n), f"{n} {what}"


def init_variance(metrics: dict, metric: str) -> tuple[float, int] | None:
    """(variance, df) of a clustering score over its k-means initialisations, from the metrics file's
    ``<metric>_std`` (numpy's, ddof 0) and ``n_init``: the sample variance std^2 * n / (n - 1); None when
    the file has no spread (one initialisation, or an older file)."""
    n, std = metrics.get("n_init"), metrics.get(f"{metric}_std")
    if not isinstance(n, int) or n < 2 or not isinstance(std, (int, float)):
        return None
    return float(std) ** 2 * n / (n - 1), n - 1


__all__ = ["RECALL", "examples_kind", "metric_units", "chance_of", "init_variance"]
