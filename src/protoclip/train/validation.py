"""Validation while training: the model's scores on a held-out set every few episodes (the tasks of
:data:`protoclip.tasks.TASKS` marked ``validation``), as open_clip's ``--zeroshot-frequency``, so that MLflow's
chart view compares runs while they train. Monitoring only: no early stop or selection reads them, and the
weights are those of a run without validation. What is shown and when: docs/mlflow.md, "Curves while training".
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from protoclip.data.loading.transforms import eval_transform
from protoclip.errors import UserError
from protoclip.evaluate.config import EvalDatasetConfig, EvaluateConfig
from protoclip.evaluate.datasets import (CaptionSet, LabelledSet, Skipped, load_eval_set, subsample_indices,
                                         subsample_set)
from protoclip.evaluate.datasets.sets import Indexed
from protoclip.evaluate.adapters import SetInput, adapter_of
from protoclip.evaluate.features import ModelFeatures
from protoclip.evaluate.plan import not_applicable
from protoclip.evaluate.stage import metric_numbers
from protoclip.files.layout import Layout
from protoclip.models.checkpoint import EvalSpec
from protoclip.tasks import TASKS
from protoclip.train.checkpoint import restore_rng, rng_state
from protoclip.train.config import TrainConfig, ValidationConfig

log = logging.getLogger(__name__)

@dataclass
class Prepared(Indexed):
    """A split decoded and transformed once (the model's evaluation transform): ``[i] -> (image tensor, label)``."""

    images: torch.Tensor
    labels: list[int]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.images[i], self.labels[i]


def prepare(split: Any, transform: Callable) -> Prepared:
    pairs = [(transform(img), int(y)) for img, y in split]
    return Prepared(torch.stack([x for x, _ in pairs]), [y for _, y in pairs])


def capped_captions(caps: CaptionSet, n: int, seed: int, transform: Callable) -> CaptionSet:
    """The caption set cut to a fixed seeded draw of at most ``n`` images (all their captions), prepared."""
    idx = np.arange(len(caps.images))
    if len(idx) > n:
        idx = subsample_indices(caps.name, "captions", len(idx), n, seed)
    images = torch.stack([transform(caps.images[int(i)][0]) for i in idx])
    return CaptionSet(caps.name, Prepared(images, list(range(len(idx)))), [caps.captions[int(i)] for i in idx],
                      source=caps.source)


class MemoTokenizer:
    """A tokenizer that keeps the tokens of the lists of texts it was given (the prompts, every validation)."""

    def __init__(self, tokenizer: Callable):
        self.tokenizer, self.memo = tokenizer, {}

    def __call__(self, texts: list[str]) -> torch.Tensor:
        key = tuple(texts)
        if key not in self.memo:
            self.memo[key] = self.tokenizer(texts)
        return self.memo[key]


def due(vcfg: ValidationConfig, episode: int, n_episodes: int, stopped_early: bool) -> bool:
    """Whether episode ``episode`` (0-based) ends with a validation: every ``every_episodes``-th, and the last one
    (of the schedule or an early stop), so that every curve ends at the final model."""
    if vcfg.every_episodes <= 0:
        return False
    return (episode + 1) % vcfg.every_episodes == 0 or episode + 1 == n_episodes or stopped_early


class Validator:
    """Scores a model on the prepared set: ``validator(model) -> {"val/<task>/<metric>": value, ...}``.

    The numbers are those ``protoclip evaluate`` computes (the same adapters on the same features). A call runs
    on the main process in eval mode under ``torch.inference_mode`` with every RNG saved and restored around it,
    so the training's random streams, its BatchNorm statistics and therefore its weights are those of a run
    without validation.
    """

    def __init__(self, vcfg: ValidationConfig, ds: LabelledSet, tasks: list[str], spec: Any, ecfg: EvaluateConfig,
                 tokenizer: Callable):
        self.cfg, self.ds, self.tasks, self.spec, self.ecfg = vcfg, ds, tasks, spec, ecfg
        self.tokenizer = MemoTokenizer(tokenizer)

    def due(self, episode: int, n_episodes: int, stopped_early: bool) -> bool:
        return due(self.cfg, episode, n_episodes, stopped_early)

    def __call__(self, model: torch.nn.Module) -> dict[str, float]:
        modes = [(m, m.training) for m in model.modules()]
        device = next(model.parameters()).device
        # every RNG training draws from, python's and numpy's too: a module first imported here may draw from them
        # (rich's import calls random.getrandbits)
        rng = rng_state()
        t0 = time.perf_counter()
        try:
            model.eval()
            with torch.inference_mode():
                side = ModelFeatures(model, self.spec, device, self.cfg.batch_size, tokenizer=self.tokenizer,
                                     transform=identity)  # the images are transformed already
                feats = side.extract(self.ds)
                x = SetInput(feats, self.ds, self.ecfg, None, side.similarity, side)
                results = {task: adapter_of(task)(x) for task in self.tasks}  # zero-shot encodes its prompts here
        finally:
            for m, training in modes:
                m.training = training
            restore_rng(rng)
        out: dict[str, float] = {}
        for task, result in results.items():
            out.update(metric_numbers(result.metrics, f"val/{task}/", nested=False, skip=SETTINGS))
        out["time/validation"] = time.perf_counter() - t0
        return out


SETTINGS = ("k", "T", "n_classes", "n_templates")  # entries of the task metrics that are settings, not scores


def identity(x: Any) -> Any:
    return x


def build_validator(ecfg: EvaluateConfig, layout: Layout, tcfg: TrainConfig, image_size: int, tokenizer: Callable
                    ) -> Validator | None:
    """The run's validator (``ecfg``: the evaluation sets and the seed it reads), its set loaded and prepared for
    the model's ``image_size`` (evaluation transform) and ``tokenizer``; None when ``validation.every_episodes``
    is 0 or the set cannot serve (not there, no labels or prompts, an image-only method without a kNN task): training goes on
    without curves, and the log says why. The set is a fixed seeded subsample of at most ``validation.max_images``
    images per split, decoded and transformed once here and held in memory::

        validator = build_validator(cfg.evaluate, layout, tcfg, model.image_size, tokenizer)  # None: off
        model = train(..., validator=validator)     # -> val/<task>/<metric> in the episode records and MLflow
    """
    vcfg = tcfg.validation
    if vcfg.every_episodes <= 0:
        return None
    name = vcfg.dataset
    spec = EvalSpec(**tcfg.method_class().eval_spec(tcfg))
    tasks = [t for t in vcfg.tasks if not (spec.image_only and TASKS[t].text)]
    ds_cfg = ecfg.datasets.get(name) or EvalDatasetConfig(kind="offline")  # load_config checked the name
    why = None
    try:
        ds = load_eval_set(name, ds_cfg, layout, seed=ecfg.seed, tasks=tasks)
    except UserError as err:  # broken evaluation data stops `evaluate`, not the training it would only watch
        ds, why = None, str(err)
    if isinstance(ds, Skipped):
        why = ds.reason
    elif isinstance(ds, LabelledSet):
        tasks = [t for t in tasks if not_applicable(t, ds) is None]
        if not tasks:
            why = f"{name} gives none of the tasks {vcfg.tasks} (labels, prompt templates, a train split, captions)"
        elif len(ds.test) == 0 or (any(TASKS[t].captions for t in tasks)
                                   and (ds.captions is None or len(ds.captions.images) < 2)):
            why = f"{name} is too small to score ({len(ds.test)} test images)"  # a held-out slice of a tiny corpus
    elif ds is not None:
        why = f"{name} is not a labelled set"
    if why is not None:
        log.warning("run %s: no validation while training (%s)", tcfg.name, why)
        return None
    t0 = time.perf_counter()
    transform = eval_transform(image_size)
    probe, templates, captions = (any(getattr(TASKS[t], what) for t in tasks)
                                  for what in ("probe", "templates", "captions"))
    ds = subsample_set(ds, vcfg.max_images if probe else None, vcfg.max_images, ecfg.seed)
    ds = replace(ds, test=prepare(ds.test, transform), templates=ds.templates if templates else [],
                 train=prepare(ds.train, transform) if probe else None,
                 captions=capped_captions(ds.captions, vcfg.max_images, ecfg.seed, transform)
                 if captions else None)
    log.info("run %s: validation on %s (%s) every %d episodes: %d test images%s, decoded in %.1f s", tcfg.name,
             name, ", ".join(tasks), vcfg.every_episodes, len(ds.test),
             f", {len(ds.train)} train images" if ds.train is not None else "", time.perf_counter() - t0)
    return Validator(vcfg, ds, tasks, spec, ecfg, tokenizer)


__all__ = ["Validator", "build_validator", "due"]
