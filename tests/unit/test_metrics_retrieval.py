"""Image-text retrieval recall@k with several captions per image (COCO / clip_benchmark protocol)."""
from __future__ import annotations

import numpy as np
import pytest

from protoclip.evaluate.metrics.retrieval import retrieval_recall


def test_hand_built_three_images_six_captions():
    e0, e1, e2 = np.eye(3)
    images = np.stack([e0, e1, e2])
    texts = np.stack([
        e0,               # caption of image 0: nearest image 0          -> rank 1
        e1 + 0.5 * e0,    # caption of image 0: cos I1 .894 > I0 .447    -> rank 2
        e1,               # caption of image 1                           -> rank 1
        e2 + 0.3 * e1,    # caption of image 1: cos I2 .958 > I1 .287    -> rank 2
        e0 + 0.2 * e2,    # caption of image 2: cos I0 .981 > I2 .196    -> rank 2
        2 * e0 + e2,      # caption of image 2: cos I0 .894 > I2 .447    -> rank 2
    ])
    text_to_image = [0, 0, 1, 1, 2, 2]
    # image -> text, captions ranked by cosine:
    #   I0: T0 1.0 (own), T4 .981, T5 .894, T1 .447   -> own caption at rank 1
    #   I1: T2 1.0 (own), T1 .894, T3 .287            -> rank 1
    #   I2: T3 .958 (image 1's!), T5 .447 (own), T4 .196 -> first own caption at rank 2
    out = retrieval_recall(images, texts, text_to_image, ks=(1, 2, 5))
    expected = {
        "image_to_text_R@1": 100 * 2 / 3, "image_to_text_R@2": 100.0, "image_to_text_R@5": 100.0,
        "text_to_image_R@1": 100 * 2 / 6, "text_to_image_R@2": 100.0, "text_to_image_R@5": 100.0,
    }
    expected["mean_recall"] = sum(expected.values()) / 6  # = 500 / 6
    assert out == pytest.approx(expected)
    assert out["mean_recall"] == pytest.approx(500 / 6)


def naive_recall(images, texts, t2i, ks):
    """Rank every candidate for every query; a query counts at k if its best-ranked positive is < k."""
    img = images / np.linalg.norm(images, axis=1, keepdims=True)
    txt = texts / np.linalg.norm(texts, axis=1, keepdims=True)
    out = {}
    first_i2t = []
    for i in range(len(img)):
        order = list(np.argsort(-(txt @ img[i]), kind="stable"))
        first_i2t.append(min(order.index(t) for t in range(len(txt)) if t2i[t] == i))
    first_t2i = []
    for t in range(len(txt)):
        order = list(np.argsort(-(img @ txt[t]), kind="stable"))
        first_t2i.append(order.index(t2i[t]))
    for k in ks:
        out[f"image_to_text_R@{k}"] = 100 * np.mean(np.array(first_i2t) < k)
    for k in ks:
        out[f"text_to_image_R@{k}"] = 100 * np.mean(np.array(first_t2i) < k)
    out["mean_recall"] = np.mean(list(out.values()))
    return out


def naive_ranks(images, texts, t2i):
    """Every query's 0-based rank of its best-ranked positive, over all candidates (cosine, stable order)."""
    img = images / np.linalg.norm(images, axis=1, keepdims=True)
    txt = texts / np.linalg.norm(texts, axis=1, keepdims=True)
    i2t = [min(list(np.argsort(-(txt @ img[i]), kind="stable")).index(t) for t in range(len(txt)) if t2i[t] == i)
           for i in range(len(img))]
    t2i_rank = [list(np.argsort(-(img @ txt[t]), kind="stable")).index(t2i[t]) for t in range(len(txt))]
    return np.array(i2t), np.array(t2i_rank)


def test_per_query_ranks_match_naive_ranking_beyond_the_top_k_too():
    """The per-query ranks (kept for the claims ledger's bootstrap) are the naive full ranks, also past max(ks),
    and give exactly the reported recalls."""
    rng = np.random.default_rng(3)
    n_img, d = 30, 8
    images = rng.normal(size=(n_img, d))
    t2i = np.repeat(np.arange(n_img), 3)
    texts = images[t2i] + 3.0 * rng.normal(size=(len(t2i), d))
    i2t_naive, t2i_naive = naive_ranks(images, texts, t2i)
    assert i2t_naive.max() >= 10 and t2i_naive.max() >= 10  # some queries rank past max(ks)
    for chunk in (7, 4096):
        out, ranks = retrieval_recall(images, texts, t2i, chunk_size=chunk, per_example=True)
        np.testing.assert_array_equal(ranks["image_to_text_rank"], i2t_naive)
        np.testing.assert_array_equal(ranks["text_to_image_rank"], t2i_naive)
        assert out == retrieval_recall(images, texts, t2i, chunk_size=chunk)  # the same numbers, to the bit
        for direction, n in (("image_to_text", n_img), ("text_to_image", len(t2i))):
            for k in (1, 5, 10):
                assert out[f"{direction}_R@{k}"] == 100.0 * int((ranks[f"{direction}_rank"] < k).sum()) / n


def test_matches_naive_ranking_with_five_captions_per_image_and_chunking():
    rng = np.random.default_rng(0)
    n_img, d = 40, 16
    images = rng.normal(size=(n_img, d))
    t2i = np.repeat(np.arange(n_img), 5)
    texts = images[t2i] + 1.2 * rng.normal(size=(len(t2i), d))  # noisy captions: recalls strictly between 0 and 100
    expected = naive_recall(images, texts, t2i, (1, 5, 10))
    for chunk in (7, 4096):
        out = retrieval_recall(images, texts, t2i, chunk_size=chunk)
        assert out == pytest.approx(expected)
    assert 0 < out["text_to_image_R@1"] < 100


def test_k_larger_than_candidates_and_bad_inputs():
    images, texts = np.eye(2), np.eye(2)
    out = retrieval_recall(images, texts, [0, 1], ks=(1, 5))
    assert out["image_to_text_R@5"] == 100.0 and out["text_to_image_R@1"] == 100.0
    with pytest.raises(ValueError, match="no caption"):
        retrieval_recall(np.eye(3)[:, :2] + 0.1, texts, [0, 1])
    with pytest.raises(ValueError, match="only 2 images"):
        retrieval_recall(images, texts, [0, 2])
    with pytest.raises(ValueError, match="positive"):
        retrieval_recall(images, texts, [0, 1], ks=(0,))


def test_all_zero_rows_are_rejected():
    x = np.eye(3, dtype=np.float32)
    bad = x.copy()
    bad[0] = 0.0
    with pytest.raises(ValueError, match="image_feats has 1 all-zero rows"):
        retrieval_recall(bad, x, [0, 1, 2])
    with pytest.raises(ValueError, match="text_feats has 1 all-zero rows"):
        retrieval_recall(x, bad, [0, 1, 2])
