"""Zero-shot classification with prompt ensembling (CLIP / open_clip protocol; ProtoCLIP Sec. IV-C1).

    W = build_zeroshot_classifier(lambda texts: model.encode_text(tokenizer(texts)), classnames, templates)
    zeroshot_classify(image_features, W, labels)   # -> {"top1": 41.2, "top5": 73.0}  (percent)
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from protoclip.evaluate.metrics._inputs import ArrayLike, features_torch, labels_np, same_dim

log = logging.getLogger(__name__)

Template = str | Callable[[str], str]


def _fill(template: Template, classname: str) -> str:
    if isinstance(template, str):
        if "{}" not in template and "{c}" not in template:
            raise ValueError(f"template {template!r} has no '{{}}' placeholder for the class name")
        return template.replace("{c}", "{}").format(classname)
    return template(classname)


@torch.no_grad()
def build_zeroshot_classifier(
    encode_text: Callable[[list[str]], torch.Tensor],
    classnames: Sequence[str],
    templates: Sequence[Template],
    classes_per_batch: int = 10,
    show_progress: bool = True,
) -> torch.Tensor:
    """Prompt-ensembled class embeddings ``[C, d]`` (float32, on the CPU), each row unit norm.

    The row of class c is the mean of the L2-normalised text embeddings of all its prompts (``template.format(c)``
    or ``template(c)``), renormalised: exactly open_clip's ``build_zero_shot_classifier``, but taking an
    ``encode_text`` callable so it does not depend on a particular model or tokenizer, and returning ``[C, d]``
    (open_clip returns the transpose). ``encode_text`` maps a list of strings to un-normalised (or normalised) text
    features ``[n, d]``; it is called on ``classes_per_batch * len(templates)`` prompts at a time.
    """
    if len(classnames) == 0:
        raise ValueError("classnames is empty")
    if len(templates) == 0:
        raise ValueError("templates is empty")
    n_t = len(templates)
    rows: list[torch.Tensor] = []
    starts = range(0, len(classnames), classes_per_batch)
    for start in tqdm(starts, desc="zero-shot classifier", disable=not show_progress, leave=False):
        batch = list(classnames[start:start + classes_per_batch])
        texts = [_fill(t, c) for c in batch for t in templates]
        emb = encode_text(texts)
        if not isinstance(emb, torch.Tensor) or emb.ndim != 2 or emb.shape[0] != len(texts):
            raise ValueError(f"encode_text must return a [n_texts, d] tensor; got "
                             f"{getattr(emb, 'shape', type(emb))} for {len(texts)} texts")
        # NaN or all-zero text features (a dead text tower) would give NaN or zero class rows, silently
        emb = features_torch(emb, f"text features of classes {batch[0]!r}..{batch[-1]!r}", nonzero=True)
        emb = F.normalize(emb, dim=-1)  # each prompt embedding on the sphere ...
        emb = emb.reshape(len(batch), n_t, -1).mean(dim=1)  # ... averaged over templates ...
        features_torch(emb, f"prompt-averaged text features of classes {batch[0]!r}..{batch[-1]!r}", nonzero=True)
        rows.append(F.normalize(emb, dim=-1).cpu())  # ... and renormalised (CLIP / open_clip)
    return torch.cat(rows, dim=0)


def topk_hits(scores: torch.Tensor, targets: torch.Tensor, k: int) -> torch.Tensor:
    """Per row: is its target among the ``k`` highest scores (bool ``[n]``; open_clip's ``accuracy`` per row)."""
    k = min(k, scores.shape[1])
    pred = scores.topk(k, dim=1).indices
    return (pred == targets[:, None]).any(dim=1)


def topk_correct(scores: torch.Tensor, targets: torch.Tensor, k: int) -> int:
    """How many rows have their target among the ``k`` highest scores (open_clip's ``accuracy``)."""
    return int(topk_hits(scores, targets, k).sum().item())


@torch.no_grad()
def zeroshot_classify(
    image_features: ArrayLike,
    classifier: ArrayLike,
    labels: ArrayLike,
    topk: Sequence[int] = (1, 5),
    batch_size: int = 4096,
    normalize: bool = True,
    per_example: bool = False,
) -> dict[str, float] | tuple[dict[str, float], dict[str, np.ndarray]]:
    """Top-k accuracy in percent of ``argmax_c cos(image, classifier[c])``.

    Both image features and classifier rows are L2-normalised here (cosine similarity); ``normalize=False``
    scores by the plain dot product (a method's own similarity embedded as a dot product, e.g. nCLIP's -CE,
    see :mod:`protoclip.similarity`). A top-k entry is reported only when the
    number of classes C is at least k (so a 2-class set has no top5). ``per_example``: return
    ``(metrics, {"top1": bool[n], ...})``, each image's hit under the same keys, from which the percentages are
    computed (``100 * hits.sum() / n``: the numbers are the same either way); the claims ledger bootstraps over
    these (protoclip.claims).
    """
    x = features_torch(image_features, "image_features", nonzero=True)
    w = features_torch(classifier, "classifier", nonzero=True)
    same_dim(x, w, "image_features", "classifier")
    y = torch.from_numpy(labels_np(labels, "labels", x.shape[0]))
    n_classes = w.shape[0]
    if int(y.max()) >= n_classes:
        raise ValueError(f"labels go up to {int(y.max())} but the classifier has only {n_classes} classes")
    if normalize:
        x, w = F.normalize(x, dim=1), F.normalize(w, dim=1)
    ks = [k for k in topk if k <= n_classes]
    hits: dict[int, list[torch.Tensor]] = {k: [] for k in ks}
    for start in range(0, x.shape[0], batch_size):
        scores = x[start:start + batch_size] @ w.T
        for k in ks:
            hits[k].append(topk_hits(scores, y[start:start + batch_size], k))
    n = x.shape[0]
    examples = {f"top{k}": torch.cat(hits[k]).numpy() for k in ks}
    out = {key: 100.0 * int(h.sum()) / n for key, h in examples.items()}
    log.info("zero-shot on %d images, %d classes: %s", n, n_classes, out)
    return (out, examples) if per_example else out
