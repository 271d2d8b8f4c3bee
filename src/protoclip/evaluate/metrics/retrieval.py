"""Zero-shot image-text retrieval recall@k (ProtoCLIP Sec. IV-C4, Table VIII; the COCO / clip_benchmark protocol):
images and captions ranked by the dot product of their L2-normalised features, each caption belonging to exactly one
image (``text_to_image[t]``), an image to one or more captions (5 in COCO).

    retrieval_recall(img_feats, txt_feats, text_to_image)  # -> {"image_to_text_R@1": .., ..., "mean_recall": ..}
"""
from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from protoclip.evaluate.metrics._inputs import ArrayLike, features_torch, labels_np, same_dim

log = logging.getLogger(__name__)


def first_match_rank(scores: torch.Tensor, positives: torch.Tensor, kmax: int) -> torch.Tensor:
    """Per query row, the 0-based rank of its first positive candidate (int64 ``[q]``).

    Within the ``kmax`` top-scored candidates it is the position in ``topk``'s order (what recall@k counts);
    a row without a positive there gets the number of candidates scored strictly above its best positive, at
    least ``kmax`` (so ``rank < k`` is recall@k's hit for every k <= kmax).
    """
    kmax = min(kmax, scores.shape[1])
    top = scores.topk(kmax, dim=1).indices  # [q, kmax], sorted by decreasing score
    pos_at_rank = positives.gather(1, top)  # [q, kmax] bool: is the r-th retrieved candidate positive
    found = pos_at_rank.any(1)
    rank = torch.where(found, pos_at_rank.float().argmax(1), torch.full_like(top[:, 0], kmax))
    if not bool(found.all()):
        best = scores.masked_fill(~positives, float("-inf")).max(dim=1, keepdim=True).values
        beyond = (scores > best).sum(dim=1).clamp(min=kmax)
        rank = torch.where(found, rank, beyond)
    return rank


def hits_at_k(scores: torch.Tensor, positives: torch.Tensor, ks: Sequence[int]) -> dict[int, int]:
    """For each k, how many query rows have at least one positive among their k top-scored candidates."""
    first_hit = first_match_rank(scores, positives, max(ks))
    return {k: int((first_hit < k).sum()) for k in ks}


@torch.no_grad()
def retrieval_recall(
    image_feats: ArrayLike,
    text_feats: ArrayLike,
    text_to_image: ArrayLike,
    ks: Sequence[int] = (1, 5, 10),
    chunk_size: int = 1024,
    device: str | torch.device = "cpu",
    normalize: bool = True,
    per_example: bool = False,
) -> dict[str, float] | tuple[dict[str, float], dict[str, np.ndarray]]:
    """Recall@k in percent both ways plus their mean (``mean_recall``, the paper's "mean recall": of the six numbers
    for ks=(1, 5, 10)); ``normalize=False``: rank by the plain dot product of the given features (a method's own
    similarity, see ``evaluate.features``).

    * text -> image: a caption query is correct at k if its image is among the k most similar images.
    * image -> text: an image query is correct at k if ANY of its captions is among the k most similar captions
      (clip_benchmark's ``recall_at_k(...) > 0``, the standard COCO 5k protocol).

    Queries are processed in chunks; instead of clip_benchmark's one-hot [queries, k, candidates] tensor we gather
    the positive mask at the top-k indices (:func:`first_match_rank`), which gives the same answer with
    O(queries * k) memory. ``per_example``: also each query's rank of its first match (0 = the top candidate,
    :func:`first_match_rank`), ``{"image_to_text_rank": [n_images], "text_to_image_rank": [n_texts]}``; R@k is
    ``100 * (rank < k).sum() / n`` of these (the same numbers)."""
    if not ks or min(ks) < 1:
        raise ValueError(f"ks must be positive integers, got {ks}")
    # zero rows have no direction: rejected where the similarity is the cosine
    img = features_torch(image_feats, "image_feats", device=device, nonzero=normalize)
    txt = features_torch(text_feats, "text_feats", device=device, nonzero=normalize)
    if normalize:
        img, txt = F.normalize(img, dim=1), F.normalize(txt, dim=1)
    same_dim(img, txt, "image_feats", "text_feats")
    t2i = labels_np(text_to_image, "text_to_image", txt.shape[0])
    n_img, n_txt = img.shape[0], txt.shape[0]
    if t2i.max() >= n_img:
        raise ValueError(f"text_to_image points at image {t2i.max()} but there are only {n_img} images")
    without = np.setdiff1d(np.arange(n_img), t2i)
    if without.size:  # such an image can never be retrieved correctly: refuse rather than deflate R@k
        raise ValueError(f"{without.size} images have no caption (first: {without[:5].tolist()})")
    t2i_t = torch.from_numpy(t2i).to(device)

    kmax = max(ks)
    t2i_rank = []
    for s in range(0, n_txt, chunk_size):
        q = txt[s:s + chunk_size]
        pos = torch.zeros(q.shape[0], n_img, dtype=torch.bool, device=device)
        pos[torch.arange(q.shape[0], device=device), t2i_t[s:s + chunk_size]] = True
        t2i_rank.append(first_match_rank(q @ img.T, pos, kmax))
    i2t_rank = []
    for s in range(0, n_img, chunk_size):
        q = img[s:s + chunk_size]
        pos = t2i_t[None, :] == torch.arange(s, s + q.shape[0], device=device)[:, None]  # [q, n_txt]
        i2t_rank.append(first_match_rank(q @ txt.T, pos, kmax))
    ranks = {"image_to_text_rank": torch.cat(i2t_rank).cpu().numpy(),
             "text_to_image_rank": torch.cat(t2i_rank).cpu().numpy()}

    out: dict[str, float] = {}
    for direction, n in (("image_to_text", n_img), ("text_to_image", n_txt)):
        for k in ks:
            out[f"{direction}_R@{k}"] = 100.0 * int((ranks[f"{direction}_rank"] < k).sum()) / n
    out["mean_recall"] = float(np.mean(list(out.values())))
    log.info("retrieval on %d images / %d captions: %s", n_img, n_txt, out)
    return (out, ranks) if per_example else out
