"""Frozen features of a trained run on an evaluation set, cached once per (run, set).

For a :class:`~protoclip.evaluate.datasets.LabelledSet`: image features ``z^I`` (encoder output, not
normalised: linear probing uses them as is, the other metrics normalise), ``h^I = g^I(z^I)`` (projection
head output: the prototype space, used by NEMD) and labels of the test and train splits, plus the
prompt-ensembled zero-shot classifier from ``z^T`` when the set has templates. For a caption set (or the
captions of ``heldout_pairs``): ``z^I`` of its images, ``z^T`` of every caption and ``text_to_image``.

When the run's method scores image-text pairs other than by the cosine of z (nCLIP's -CE, multi-token CLIP's
summed per-token cosine: the model file's ``EvalSpec``, :func:`protoclip.models.read_eval_spec`), the method's
similarity is also
stored as a dot product: ``test_s`` / ``zeroshot_classifier_s`` and ``caption_image_s`` / ``caption_text_s``
plus ``similarity`` (the kind) and ``subspheres`` (m); the evaluation stage then uses those with
``normalize=False``.

The arrays live in ``results/runs/<run>/features/<set>.npz`` (written atomically) with a ``meta_json``
entry: beside the evaluation job's output folder, not in it, so that a rerun of the job (Snakemake deletes its
outputs first) still finds them, and DVC stores them only when ``evaluate.track_features`` asks. The cache is
reused only when the model file's sha256, the data source, the split sizes, the probe subsample (``max_train`` /
``max_test`` / seed) and the class names / templates are unchanged, so a retrained ``model.pt`` or a changed
subsample invalidates it. With a ``work`` folder the image features are extracted in chunks there
(:mod:`protoclip.evaluate.resumable`): a killed extraction continues from its last whole chunk.

    ex = FeatureExtractor(layout.model(run), device="auto", batch_size=256)
    feats = ex.features(layout.features(run, "cifar10"), dataset, work=layout.eval_progress(run, "cifar10"))
"""
from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from protoclip.atomic import atomic_path
from protoclip.datafiles import READ_ERRORS, first_line
from protoclip.hashing import sha256_file
from protoclip.data.transforms import eval_transform
from protoclip.devices import resolve_device
from protoclip.evaluate.datasets import EvalSet, ImageSplit, LabelledSet
from protoclip.evaluate.resumable import ExtractionProgress, encode_images_resumable

log = logging.getLogger(__name__)

CACHE_VERSION = 3  # 2: + the method's similarity embeddings (*_s); 3: nCLIP *_s from log_softmax, + subspheres


def _text_hash(items: Iterable[str]) -> str:
    return hashlib.sha256("\x1f".join(items).encode()).hexdigest()[:16]


class _Transformed(Dataset):
    """A map-style split with the model's transform applied: ``[i] -> (tensor, label)``."""

    def __init__(self, split: ImageSplit, transform: Callable):
        self.split, self.transform = split, transform

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        img, y = self.split[i]  # type: ignore[index]
        return self.transform(img), int(y)


def image_batches(split: ImageSplit, transform: Callable, batch_size: int,
                  num_workers: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(images [B,3,H,W], labels [B])`` in split order. Map-style splits (with ``__getitem__``) go through a
    DataLoader so decoding can use ``num_workers`` processes; iterable ones (webdataset) are read in-process."""
    if hasattr(split, "__getitem__"):
        yield from DataLoader(_Transformed(split, transform), batch_size=batch_size, shuffle=False,
                              num_workers=num_workers)
        return
    xs: list[torch.Tensor] = []
    ys: list[int] = []
    for img, y in split:
        xs.append(transform(img))
        ys.append(int(y))
        if len(xs) == batch_size:
            yield torch.stack(xs), torch.tensor(ys)
            xs, ys = [], []
    if xs:
        yield torch.stack(xs), torch.tensor(ys)


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


# ---- the training method's similarity (methods-spec 5.6: zero-shot / retrieval score per method)
# "cosine": cos(z^I, z^T) (CLIP, ProtoCLIP, xCLIP's CLIP head); the metrics normalise z themselves.
# "product_sphere": sum over the m tokens / chunks of per-token cosines (temperature paper Fig. 6, PS(n, m)
#   negative trace); prompts are ensembled by averaging the per-prompt scores (paper Sec. 5.2 averages
#   logits, not embeddings: spec 2.5 / 2.7.7), i.e. the mean of the chunk-normalised text embeddings.
# "nclip_ce": s = 1/2 (p_I . log p_T + p_T . log p_I), p = softmax of the nCLIP head (paper: -L_CE;
#   spec 1.7.4), prompts ensembled by averaging the probability vectors (spec 1.7.4). Carried as
#   log-probabilities (log_softmax; the ensemble mean by logsumexp), never log(softmax): softmax underflows
#   in float32 once head logits are sharp (spec 1.7.7).
# The non-cosine kinds are written as a dot product of an image embedding and a text embedding
# (``*_s`` arrays; metrics called with normalize=False). Which kind a run uses, and m, are in its model file
# (protoclip.models.checkpoint.EvalSpec, written by the training method).
def similarity_embeddings(kind: str, side: str, z: torch.Tensor, h: torch.Tensor | None, subspheres: int = 1,
                          pre: torch.Tensor | None = None) -> torch.Tensor:
    """Embeddings whose dot product is the method's similarity. ``side``: "image" or "text". For the text side
    of a prompt ensemble pass ``pre`` = the mean over prompts of :func:`similarity_pre` (else computed here)."""
    if kind == "product_sphere":
        return pre if pre is not None else similarity_pre(kind, z, h, subspheres)
    if kind == "nclip_ce":
        logp = pre if pre is not None else similarity_pre(kind, z, h, subspheres)
        p = logp.exp()
        return 0.5 * torch.cat([p, logp], 1) if side == "image" else torch.cat([logp, p], 1)  # dot = s
    raise ValueError(f"no dot-product embedding for similarity {kind!r}")


def similarity_pre(kind: str, z: torch.Tensor, h: torch.Tensor | None, subspheres: int = 1) -> torch.Tensor:
    """What a prompt ensemble averages (:func:`ensemble_pre`): chunk-normalised z (product sphere) or the
    log-probabilities log p of the head softmax (nCLIP)."""
    from protoclip.losses.distances import product_sphere

    if kind == "product_sphere":
        return product_sphere(z.float(), subspheres).flatten(1)
    if kind == "nclip_ce":
        return torch.log_softmax(h.float(), dim=1)
    raise ValueError(f"unknown similarity {kind!r}")


def nclip_image_as_target(image_s: np.ndarray, text_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """From the nCLIP dot-product embeddings (image 1/2 [p, log p], text [log q, q]) the pair whose dot product is
    the image-as-target score p_I . log p_T (the paper's L_CE with the image distribution as the target; spec
    1.7.4 asks to log it beside the symmetric score)."""
    k = image_s.shape[1] // 2
    return 2.0 * image_s[:, :k], text_s[:, :k]


def ensemble_pre(kind: str, pre: torch.Tensor) -> torch.Tensor:
    """[n_prompts, D] -> [1, D]: the mean over prompts of the chunk-normalised z, or for nCLIP the log of the
    mean probability vector, log(1/n sum_k p_k) = logsumexp_k(log p_k) - log n (exact where p underflows)."""
    if kind == "nclip_ce":
        return torch.logsumexp(pre, 0, keepdim=True) - float(np.log(pre.shape[0]))
    return pre.mean(0, keepdim=True)


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
        from protoclip.models import read_eval_spec

        self.spec = read_eval_spec(self.model_path)  # how the training method scores this model
        self.similarity, self.subspheres = self.spec.similarity, self.spec.subspheres
        self._model: Any = None

    # ---- lazy model
    def _load(self) -> None:
        from protoclip.models import get_tokenizer, load_model

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
        return make_text_encoder(self.model, self.tokenizer, self.device, self.batch_size)

    # ---- cache
    def cache_key(self, ds: EvalSet) -> dict[str, Any]:
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

    def features(self, cache: str | Path, ds: EvalSet, work: str | Path | None = None) -> dict[str, np.ndarray]:
        """Cached arrays of ``ds`` (see the module docstring for the keys); extracted on a miss, in resumable
        chunks under ``work`` when given (removed once the cache file is written)."""
        cache = Path(cache)
        key = self.cache_key(ds)
        if cache.exists():
            try:
                with np.load(cache, allow_pickle=False) as z:
                    stored = json.loads(str(z["meta_json"])) if "meta_json" in z.files else None
                    if stored == key:
                        log.info("%s: cached features %s", ds.name, cache)
                        return {k: z[k] for k in z.files if k != "meta_json"}
                log.info("%s: feature cache %s is stale (model or data changed); re-extracting", ds.name, cache)
            except READ_ERRORS as err:  # our own cache, cut or damaged: extract again rather than stop
                log.warning("%s: feature cache %s is unreadable (%s); re-extracting", ds.name, cache, first_line(err))
        progress = None
        if work is not None:
            progress = ExtractionProgress(work, {**key, "chunk_images": self.batch_size * self.chunk_batches}).open()
        arrays = self.extract(ds, progress)
        with atomic_path(cache) as tmp:
            with open(tmp, "wb") as f:  # np.savez on a file object: no ".npz" appended to the temp name
                np.savez(f, meta_json=np.array(json.dumps(key, sort_keys=True)), **arrays)
        if progress is not None:
            progress.remove()
        return arrays

    def _encode(self, split: ImageSplit, desc: str, progress: ExtractionProgress | None,
                part: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if progress is None:
            return encode_images(self.model, split, self.transform, self.device, self.batch_size, desc=desc,
                                 num_workers=self.num_workers)
        return encode_images_resumable(self.model, split, self.transform, self.device, self.batch_size, desc,
                                       self.num_workers, progress.part(part), self.chunk_batches)

    def extract(self, ds: EvalSet, progress: ExtractionProgress | None = None) -> dict[str, np.ndarray]:
        model, out = self.model, {}
        if isinstance(ds, LabelledSet):
            for split_name, split in (("test", ds.test), ("train", ds.train)):
                if split is None or len(split) == 0:  # e.g. held-out pairs without coarse labels
                    continue
                z, h, y = self._encode(split, f"{ds.name} {split_name}", progress, split_name)
                out.update({f"{split_name}_z": z, f"{split_name}_h": h, f"{split_name}_y": y})
            if ds.templates:
                from protoclip.evaluate.metrics.zeroshot import build_zeroshot_classifier

                out["zeroshot_classifier"] = build_zeroshot_classifier(
                    self.text_encoder(), ds.classnames, ds.templates).numpy()
                if self.similarity != "cosine":
                    out.update(self._similarity_zeroshot(ds, out["test_z"], out["test_h"]))
            caps = ds.captions
        else:
            caps = ds
        if caps is not None:
            z, h, _ = self._encode(caps.images, f"{ds.name} caption images", progress, "caption_images")
            out["caption_image_z"] = z
            out["caption_text_z"] = self.text_encoder()(caps.texts).numpy()
            out["caption_text_to_image"] = caps.text_to_image
            if self.similarity != "cosine":
                out.update(self._similarity_captions(z, h, caps.texts))
        return out

    # ---- the method's own similarity (see similarity_embeddings)
    def _text_pre(self, texts: list[str]) -> torch.Tensor:
        model, out = self.model, []
        with torch.no_grad():
            for i in range(0, len(texts), self.batch_size):
                z = model.encode_text(self.tokenizer(texts[i:i + self.batch_size]).to(self.device))
                out.append(similarity_pre(self.similarity, z, model.text_head(z), self.subspheres).float().cpu())
        return torch.cat(out)

    def _image_s(self, z: np.ndarray, h: np.ndarray) -> np.ndarray:
        return similarity_embeddings(self.similarity, "image", torch.from_numpy(z), torch.from_numpy(h),
                                     self.subspheres).numpy()

    def _similarity_zeroshot(self, ds: LabelledSet, test_z: np.ndarray, test_h: np.ndarray) -> dict[str, np.ndarray]:
        from protoclip.evaluate.metrics.zeroshot import _fill

        rows = []
        for c in tqdm(ds.classnames, desc=f"{ds.name} {self.similarity} classifier", leave=False):
            pre = ensemble_pre(self.similarity, self._text_pre([_fill(t, c) for t in ds.templates]))
            rows.append(similarity_embeddings(self.similarity, "text", None, None, self.subspheres, pre=pre))
        return {"test_s": self._image_s(test_z, test_h), "zeroshot_classifier_s": torch.cat(rows).numpy(),
                "similarity": np.array(self.similarity), "subspheres": np.array(self.subspheres)}

    def _similarity_captions(self, z: np.ndarray, h: np.ndarray, texts: list[str]) -> dict[str, np.ndarray]:
        text_s = similarity_embeddings(self.similarity, "text", None, None, self.subspheres, pre=self._text_pre(texts))
        return {"caption_image_s": self._image_s(z, h), "caption_text_s": text_s.numpy(),
                "similarity": np.array(self.similarity), "subspheres": np.array(self.subspheres)}


class ModelFeatures(FeatureExtractor):
    """:meth:`FeatureExtractor.extract` over a model held in memory (validation while training): no model file and
    no cache; ``spec`` (:class:`~protoclip.models.checkpoint.EvalSpec`) says how its method scores pairs.
    ``tokenizer`` / ``transform``: the model's own when None (a caller whose images are transformed already
    passes the identity)."""

    def __init__(self, model: Any, spec: Any, device: torch.device, batch_size: int = 256,
                 tokenizer: Callable | None = None, transform: Callable | None = None):
        from protoclip.models import get_tokenizer

        self.model_path, self.model_sha256 = None, None  # type: ignore[assignment]
        self.device, self.batch_size, self.num_workers = device, int(batch_size), 0
        self.spec, self.similarity, self.subspheres = spec, spec.similarity, spec.subspheres
        self._model = model
        self.tokenizer = tokenizer or get_tokenizer(model.name, context_length=model.context_length)
        self.transform = transform or eval_transform(model.image_size)


__all__ = ["FeatureExtractor", "ModelFeatures", "encode_images", "make_text_encoder", "resolve_device", "sha256_file"]
