"""Zero-shot classifier building (prompt ensembling) and zero-shot top-k accuracy."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from protoclip.evaluate.metrics.zeroshot import build_zeroshot_classifier, zeroshot_classify

D = 8


def fake_text_vector(text: str) -> np.ndarray:
    """A fixed pseudo-random vector per string (stands in for a text encoder)."""
    seed = int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)
    return np.random.default_rng(seed).normal(size=D)


def fake_encode_text(texts: list[str]) -> torch.Tensor:
    # scale each embedding by a text-dependent factor: the ensemble must not depend on raw norms
    return torch.tensor(np.stack([fake_text_vector(t) * (1 + len(t)) for t in texts]), dtype=torch.float32)


def test_classifier_is_normalised_mean_of_normalised_prompt_embeddings():
    classnames = ["cat", "dog", "kite (bird of prey)"]
    templates = ["a photo of a {}.", "a drawing of the {}.", "{}"]
    W = build_zeroshot_classifier(fake_encode_text, classnames, templates, classes_per_batch=2, show_progress=False)
    assert W.shape == (3, D)
    for c, name in enumerate(classnames):
        embs = [fake_text_vector(t.format(name)) for t in templates]
        mean = np.mean([e / np.linalg.norm(e) for e in embs], axis=0)
        expected = mean / np.linalg.norm(mean)
        np.testing.assert_allclose(W[c].numpy(), expected, rtol=1e-5, atol=1e-6)


def test_callable_and_string_templates_and_batching_agree():
    classnames = [f"class {i}" for i in range(7)]
    W_str = build_zeroshot_classifier(fake_encode_text, classnames, ["a {}.", "the {}!"], classes_per_batch=3,
                                      show_progress=False)
    W_fn = build_zeroshot_classifier(fake_encode_text, classnames, [lambda c: f"a {c}.", lambda c: f"the {c}!"],
                                     classes_per_batch=100, show_progress=False)
    torch.testing.assert_close(W_str, W_fn)


def test_bad_templates_and_encoder_output_are_rejected():
    with pytest.raises(ValueError, match="placeholder"):
        build_zeroshot_classifier(fake_encode_text, ["a"], ["no placeholder"], show_progress=False)
    with pytest.raises(ValueError, match="n_texts, d"):
        build_zeroshot_classifier(lambda t: torch.zeros(1, D), ["a", "b"], ["{}"], show_progress=False)
    with pytest.raises(ValueError, match="empty"):
        build_zeroshot_classifier(fake_encode_text, [], ["{}"], show_progress=False)


def test_class_directions_give_100_percent():
    rng = np.random.default_rng(0)
    C, n = 6, 300
    classifier = np.eye(C, 16)  # class c points along axis c
    y = rng.integers(0, C, n)
    # image = positive multiple of its class axis plus small noise: cosine is maximal for its class
    x = classifier[y] * rng.uniform(0.5, 20, (n, 1)) + 0.05 * rng.normal(size=(n, 16))
    out = zeroshot_classify(x, classifier, y)
    assert out == {"top1": 100.0, "top5": 100.0}


def test_random_features_give_chance():
    # labels are independent of features, so E[acc] = 1/C exactly; n = 4000, C = 10:
    # std(top1) = sqrt(.1 * .9 / 4000) = 0.47 points -> tolerance 2.0 points (> 4 std)
    rng = np.random.default_rng(1)
    C, n = 10, 4000
    out = zeroshot_classify(rng.normal(size=(n, 32)), rng.normal(size=(C, 32)), rng.integers(0, C, n))
    assert abs(out["top1"] - 10.0) < 2.0
    assert abs(out["top5"] - 50.0) < 3.2  # std 0.79 points


def test_matches_naive_loop_and_is_batch_invariant():
    rng = np.random.default_rng(2)
    C, n, d = 7, 250, 12
    x, w, y = rng.normal(size=(n, d)), rng.normal(size=(C, d)), rng.integers(0, C, n)
    hits1, hits5 = [], []
    for i in range(n):
        sims = [x[i] @ w[c] / (np.linalg.norm(x[i]) * np.linalg.norm(w[c])) for c in range(C)]
        order = sorted(range(C), key=lambda c: -sims[c])
        hits1.append(order[0] == y[i])
        hits5.append(y[i] in order[:5])
    out = zeroshot_classify(torch.tensor(x), torch.tensor(w), torch.tensor(y), batch_size=17)
    assert out["top1"] == pytest.approx(100 * sum(hits1) / n)
    assert out["top5"] == pytest.approx(100 * sum(hits5) / n)
    # per image (the claims ledger's bootstrap units): the naive hits, and exactly the same numbers
    same, hits = zeroshot_classify(torch.tensor(x), torch.tensor(w), torch.tensor(y), batch_size=17,
                                   per_example=True)
    assert same == out
    np.testing.assert_array_equal(hits["top1"], hits1)
    np.testing.assert_array_equal(hits["top5"], hits5)
    assert out["top1"] == 100.0 * int(hits["top1"].sum()) / n


def test_top5_only_with_at_least_5_classes_and_label_checks():
    rng = np.random.default_rng(3)
    out = zeroshot_classify(rng.normal(size=(20, 4)), rng.normal(size=(3, 4)), rng.integers(0, 3, 20))
    assert set(out) == {"top1"}
    with pytest.raises(ValueError, match="only 3 classes"):
        zeroshot_classify(rng.normal(size=(5, 4)), rng.normal(size=(3, 4)), [0, 1, 2, 3, 0])
    with pytest.raises(ValueError, match="dimension"):
        zeroshot_classify(rng.normal(size=(5, 4)), rng.normal(size=(3, 5)), [0, 1, 2, 0, 0])
    with pytest.raises(ValueError, match="entries"):
        zeroshot_classify(rng.normal(size=(5, 4)), rng.normal(size=(3, 4)), [0, 1])


def test_all_zero_rows_are_rejected():
    x = np.eye(3, dtype=np.float32)
    bad = x.copy()
    bad[2] = 0.0
    with pytest.raises(ValueError, match="image_features has 1 all-zero rows"):
        zeroshot_classify(bad, x, [0, 1, 2])
    with pytest.raises(ValueError, match="classifier has 1 all-zero rows"):
        zeroshot_classify(x, torch.from_numpy(bad), [0, 1, 2])


@pytest.mark.parametrize("bad", ["nan", "zero", "cancelling"])
def test_nan_or_zero_text_features_are_rejected(bad):
    """A dead text tower (NaN or zero rows), or prompts whose normalised embeddings cancel, must not give a
    classifier silently (the row would be NaN or zero)."""
    def encode(texts):
        out = fake_encode_text(texts)
        if bad == "nan":
            out[1, 0] = float("nan")
        elif bad == "zero":
            out[1] = 0.0
        else:  # the second template is the exact opposite of the first: their mean is 0
            out[1::2] = -out[0::2]
        return out

    want = {"nan": "^text features of classes 'a'..'b' contains NaN",
            "zero": r"^text features of classes 'a'..'b' has 1 all-zero rows \(first: \[1\]\)",
            "cancelling": "^prompt-averaged text features of classes 'a'..'b' has 2 all-zero rows"}[bad]
    with pytest.raises(ValueError, match=want):
        build_zeroshot_classifier(encode, ["a", "b"], ["{}", "x {}"], show_progress=False)
