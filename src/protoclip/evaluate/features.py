"""Frozen features of a trained run on an evaluation set (a :class:`~protoclip.evaluate.set_features.SetFeatures`),
extracted once per (run, set) and cached in ``results/runs/<run>/features/<set>.npz``.

    ex = FeatureExtractor(layout.model(run), device="auto", batch_size=256)
    feats = ex.features(layout.features(run, "cifar10"), dataset, work=layout.eval_progress(run, "cifar10"))
"""
from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from protoclip.files.datafiles import READ_ERRORS, first_line
from protoclip.files.hashing import sha256_file
from protoclip.data.loading.transforms import eval_transform
from protoclip.jobs.devices import resolve_device
from protoclip.evaluate.datasets import EvalSet, ImageSplit, LabelledSet
from protoclip.evaluate.batches import image_batches
from protoclip.evaluate.resumable import ExtractionProgress, encode_images_resumable
from protoclip.evaluate.set_features import SetFeatures
from protoclip.models import get_tokenizer, load_model, read_eval_spec
from protoclip.models.checkpoint import EvalSpec, ModelFileError
from protoclip.models.pretrained import load_pretrained
from protoclip.similarity import similarity_of

log = logging.getLogger(__name__)

CACHE_VERSION = 4  # bumped whenever the arrays a cache holds change


def _text_hash(items: Iterable[str]) -> str:
    return hashlib.sha256("\x1f".join(items).encode()).hexdigest()[:16]


@torch.inference_mode()  # no autograd bookkeeping at all (no_grad still tracks versions): same values
def encode_images(
    model: Any,
    split: ImageSplit,
    transform: Callable,
    device: torch.device,
    batch_size: int = 256,
    desc: str = "images",
    num_workers: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(z [N, d], h [N, d_h], labels [N])`` of every image of ``split`` (model in eval mode, no grad)."""
    zs: list[torch.Tensor] = []
    hs: list[torch.Tensor] = []
    labels: list[torch.Tensor] = []
    with tqdm(total=len(split), desc=desc, unit="img", leave=False) as bar:
        for x, y in image_batches(split, transform, batch_size, num_workers):
            z = model.encode_image(x.to(device))
            zs.append(z.float().cpu())
            hs.append(model.image_head(z).float().cpu())
            labels.append(y.long())
            bar.update(len(y))
    if not zs:
        raise ValueError(f"{desc}: no images")
    return torch.cat(zs).numpy(), torch.cat(hs).numpy(), torch.cat(labels).numpy()


def make_text_encoder(model: Any, tokenizer: Callable, device: torch.device,
                      batch_size: int = 256) -> Callable[[list[str]], torch.Tensor]:
    """``encode_text(list[str]) -> z^T [n, d]`` (CPU float tensor), batched, no grad."""

    @torch.inference_mode()
    def encode(texts: list[str]) -> torch.Tensor:
        out = [model.encode_text(tokenizer(texts[i:i + batch_size]).to(device)).float().cpu()
               for i in range(0, len(texts), batch_size)]
        return torch.cat(out)

    return encode


class FeatureExtractor:
    """Loads the run's model lazily (only on a cache miss) and extracts / caches features per set."""

    def __init__(self, model_path: str | Path, device: str = "auto", batch_size: int = 256, num_workers: int = 0,
                 chunk_batches: int = 16):
        self.model_path = Path(model_path)
        self.chunk_batches = int(chunk_batches)  # batches per chunk of a resumable extraction (``work``)
        if not self.model_path.is_file():
            raise FileNotFoundError(f"model file not found: {self.model_path} (train the run first)")
        self.device = resolve_device(device)
        self.batch_size = int(batch_size)
        self.num_workers = int(num_workers)
        self.model_sha256 = sha256_file(self.model_path)
        self.spec = read_eval_spec(self.model_path)  # how the training method scores this model
        try:
            self.similarity = similarity_of(self.spec.method, self.spec.similarity, self.spec.subspheres)
        except ValueError as err:  # a method unknown here, or a similarity it does not have
            raise ModelFileError(f"{self.model_path}: {err}") from None
        self._model: Any = None

    # ---- lazy model
    def _load(self) -> None:
        self._model, _config = load_model(self.model_path, self.device)
        self._model.eval()
        self.tokenizer = get_tokenizer(self._model.name, context_length=self._model.context_length)
        self.transform = eval_transform(self._model.image_size)

    @property
    def model(self) -> Any:
        if self._model is None:
            self._load()
        return self._model

    def text_encoder(self) -> Callable[[list[str]], torch.Tensor]:
        """``encode_text`` for the zero-shot task's classifier (built in protoclip.evaluate.adapters, with
        :meth:`text_pre` where the method has a similarity of its own)."""
        return make_text_encoder(self.model, self.tokenizer, self.device, self.batch_size)

    # ---- cache
    def cache_key(self, ds: EvalSet) -> dict[str, Any]:
        """What the cached features of ``ds`` were extracted from: the model file's sha256, the data source, the
        split sizes, the probe subsample (``max_train`` / ``max_test`` / seed), the class names / templates and
        captions. A cache is reused only when this is unchanged, so a retrained ``model.pt`` or a changed subsample
        invalidates it."""
        key: dict[str, Any] = {"version": CACHE_VERSION, "model_sha256": self.model_sha256, "dataset": ds.name,
                               "source": ds.source}
        if isinstance(ds, LabelledSet):
            key.update(n_test=len(ds.test), n_train=len(ds.train) if ds.train is not None else 0,
                       classnames=_text_hash(ds.classnames), templates=_text_hash(ds.templates))
            if ds.subsample is not None:  # a changed max / seed picks other images at the same sizes
                key["subsample"] = ds.subsample
            caps = ds.captions
        else:
            caps = ds
        if caps is not None:
            key.update(n_caption_images=len(caps.images), captions=_text_hash(caps.texts))
        return key

    def features(self, cache: str | Path, ds: EvalSet, work: str | Path | None = None) -> SetFeatures:
        """The cached features of ``ds``; extracted on a miss, in resumable chunks under ``work`` when given
        (:mod:`protoclip.evaluate.resumable`: a killed extraction continues from its last whole chunk; the folder is
        removed once the cache file is written).

        ``cache`` (``results/runs/<run>/features/<set>.npz``, written atomically with a ``meta_json`` entry, the
        :meth:`cache_key`) lies beside the evaluation job's output folder, not in it, so that a rerun of the job
        (Snakemake deletes its outputs first) still finds it; DVC stores it only when ``evaluate.track_features``
        asks."""
        cache = Path(cache)
        key = self.cache_key(ds)
        if cache.exists():
            try:
                if (cached := SetFeatures.load(cache, key)) is not None:
                    log.info("%s: cached features %s", ds.name, cache)
                    return cached
                log.info("%s: feature cache %s is stale (model or data changed); re-extracting", ds.name, cache)
            except READ_ERRORS as err:  # our own cache, cut or damaged: extract again rather than stop
                log.warning("%s: feature cache %s is unreadable (%s); re-extracting", ds.name, cache, first_line(err))
        progress = None
        if work is not None:
            progress = ExtractionProgress(work, {**key, "chunk_images": self.batch_size * self.chunk_batches}).open()
        feats = self.extract(ds, progress)
        feats.save(cache, key)
        if progress is not None:
            progress.remove()
        return feats

    def _encode(self, split: ImageSplit, desc: str, progress: ExtractionProgress | None,
                part: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if progress is None:
            return encode_images(self.model, split, self.transform, self.device, self.batch_size, desc=desc,
                                 num_workers=self.num_workers)
        return encode_images_resumable(self.model, split, self.transform, self.device, self.batch_size, desc,
                                       self.num_workers, progress.part(part), self.chunk_batches)

    def extract(self, ds: EvalSet, progress: ExtractionProgress | None = None) -> SetFeatures:
        out: dict[str, np.ndarray] = {}
        if isinstance(ds, LabelledSet):
            for split_name, split in (("test", ds.test), ("train", ds.train)):
                if split is None or len(split) == 0:  # e.g. held-out pairs without coarse labels
                    continue
                z, h, y = self._encode(split, f"{ds.name} {split_name}", progress, split_name)
                out.update({f"{split_name}_z": z, f"{split_name}_h": h, f"{split_name}_y": y})
            if ds.templates and self.similarity.dot_product and "test_z" in out:
                out["test_s"] = self._image_s(out["test_z"], out["test_h"])
            caps = ds.captions
        else:
            caps = ds
        if caps is not None:
            z, h, _ = self._encode(caps.images, f"{ds.name} caption images", progress, "caption_images")
            out["caption_image_z"] = z
            out["caption_text_to_image"] = caps.text_to_image
            if self.similarity.dot_product:
                out["caption_image_s"] = self._image_s(z, h)
            # a model without a text tower (an image-only torchvision backbone) has no caption features: every
            # task reading them is a text task, not applicable to an image-only method (evaluate.plan)
            if getattr(self.model, "text_head", None) is not None:
                out["caption_text_z"] = self.text_encoder()(caps.texts).numpy()
                if self.similarity.dot_product:
                    out["caption_text_s"] = self.similarity.text(self.text_pre(caps.texts)).numpy()
        return SetFeatures(**out)

    # ---- the method's own similarity (protoclip.similarity)
    def text_pre(self, texts: list[str]) -> torch.Tensor:
        """The similarity's :meth:`~protoclip.similarity.Similarity.pre` of each text, batched, no grad."""
        model, out = self.model, []
        with torch.no_grad():
            for i in range(0, len(texts), self.batch_size):
                z = model.encode_text(self.tokenizer(texts[i:i + self.batch_size]).to(self.device))
                out.append(self.similarity.pre(z, model.text_head(z)).float().cpu())
        return torch.cat(out)

    def _image_s(self, z: np.ndarray, h: np.ndarray) -> np.ndarray:
        return self.similarity.image(torch.from_numpy(z), torch.from_numpy(h)).numpy()


class ModelFeatures(FeatureExtractor):
    """:meth:`FeatureExtractor.extract` over a model held in memory (validation while training): no model file and
    no cache; ``spec`` (:class:`~protoclip.models.checkpoint.EvalSpec`) says how its method scores pairs.
    ``tokenizer`` / ``transform``: the model's own when None (a caller whose images are transformed already
    passes the identity)."""

    def __init__(self, model: Any, spec: Any, device: torch.device, batch_size: int = 256,
                 tokenizer: Callable | None = None, transform: Callable | None = None):
        self.model_path, self.model_sha256 = None, None  # type: ignore[assignment]
        self.device, self.batch_size, self.num_workers = device, int(batch_size), 0
        self.spec, self.chunk_batches = spec, 16
        self.similarity = similarity_of(spec.method, spec.similarity, spec.subspheres)
        self._model = model
        self.tokenizer = tokenizer or get_tokenizer(model.name, context_length=model.context_length)
        self.transform = transform or eval_transform(model.image_size)


class PretrainedFeatures(FeatureExtractor):
    """:class:`FeatureExtractor` of a released open_clip checkpoint (a run's ``pretrained`` section,
    :mod:`protoclip.models.pretrained`): no model file; the checkpoint's own tokenizer and preprocessing, scored as
    CLIP (cosine); ``model_sha256`` is its weights file's, so the feature caches and metrics files name it."""

    def __init__(self, model: str | None, tag: str, device: str = "auto", batch_size: int = 256,
                 num_workers: int = 0, chunk_batches: int = 16):
        self.model_path = None  # type: ignore[assignment]
        self.device, self.batch_size, self.num_workers = resolve_device(device), int(batch_size), int(num_workers)
        self.chunk_batches = int(chunk_batches)
        self._model, self.tokenizer, self.transform, weights = load_pretrained(model, tag, self.device)
        self.model_sha256 = sha256_file(weights)
        self.spec = EvalSpec(method="clip", similarity="cosine")
        self.similarity = similarity_of(self.spec.method, self.spec.similarity, self.spec.subspheres)


__all__ = ["FeatureExtractor", "ModelFeatures", "PretrainedFeatures", "encode_images", "make_text_encoder", "resolve_device", "sha256_file"]
