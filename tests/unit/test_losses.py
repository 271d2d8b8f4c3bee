"""Known-answer tests of protoclip.losses: L_CLIP (Eq. 1), soft targets (Eq. 5), PBT (Eq. 7), L_Proto (Eqs. 3-4),
the external term (Eq. 8); each expected value is computed here with explicit loops or by hand."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from protoclip.losses import ProtoLoss, clamp_logit_scale_, clip_loss, proto_ce, soft_target_rows
from protoclip.prototypes import EpisodePrototypes, KMeansResult, pbt_centroids


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _unit(n: int, d: int, seed: int) -> torch.Tensor:
    return F.normalize(torch.randn(n, d, generator=_gen(seed)), dim=1)


def _log_softmax_at(row: list[float], j: int) -> float:
    return row[j] - math.log(sum(math.exp(v) for v in row))


# --------------------------------------------------------------------------- L_CLIP
def test_clip_loss_matches_naive_loop():
    zi, zt, scale = _unit(6, 5, 0), _unit(6, 5, 1), 7.5
    n = 6
    sim = [[float(zi[i] @ zt[j]) * scale for j in range(n)] for i in range(n)]
    i2t = -sum(_log_softmax_at(sim[i], i) for i in range(n)) / n
    t2i = -sum(_log_softmax_at([sim[j][i] for j in range(n)], i) for i in range(n)) / n
    got = clip_loss(zi * 3.0, zt * 0.5, torch.tensor(scale))["clip"]  # un-normalised input: normalised inside
    assert float(got) == pytest.approx((i2t + t2i) / 2, rel=1e-5)


def test_clip_loss_2x2_hand_value():
    zi = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    zt = torch.tensor([[1.0, 0.0], [0.6, 0.8]])
    # image->text logits [[1, .6], [0, .8]], text->image [[1, 0], [.6, .8]], scale 1
    expected = (math.log(1 + math.exp(-0.4)) + math.log(1 + math.exp(-0.8))
                + math.log(1 + math.exp(-1.0)) + math.log(1 + math.exp(-0.2))) / 4
    assert float(clip_loss(zi, zt, 1.0)["clip"]) == pytest.approx(expected, rel=1e-6)


def test_clip_loss_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="differ"):
        clip_loss(torch.randn(3, 4), torch.randn(2, 4), 1.0)


def test_clamp_logit_scale():
    p = torch.nn.Parameter(torch.tensor(math.log(250.0)))
    clamp_logit_scale_(p)
    assert float(p.detach()) == pytest.approx(math.log(100.0))
    p.data.fill_(-0.5)
    clamp_logit_scale_(p, max_scale=100)
    assert float(p.detach()) == 0.0
    p.data.fill_(math.log(1 / 0.07))
    clamp_logit_scale_(p)
    assert float(p.detach()) == pytest.approx(math.log(1 / 0.07))
    with pytest.raises(ValueError):
        clamp_logit_scale_(p, max_scale=1.0)


# --------------------------------------------------------------------------- soft targets (Eq. 5)
def soft_targets(prototypes: torch.Tensor, tau_y: float, hard: bool = False) -> torch.Tensor:
    """Target table of every prototype [Eq. 5]: row k = softmax(C c_k / tau_y) -> [K, K] (hard: identity)."""
    return soft_target_rows(prototypes, torch.arange(prototypes.shape[0]), tau_y, hard=hard)


def test_soft_targets_hand_value_and_properties():
    c = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    y = soft_targets(c, tau_y=0.5)
    e2 = math.exp(2.0)
    torch.testing.assert_close(y, torch.tensor([[e2 / (e2 + 1), 1 / (e2 + 1)], [1 / (e2 + 1), e2 / (e2 + 1)]]))

    c = _unit(12, 6, 3)
    y = soft_targets(c, tau_y=0.1)
    torch.testing.assert_close(y.sum(1), torch.ones(12))
    assert torch.equal(y.argmax(1), torch.arange(12))  # unit prototypes: each is closest to itself
    torch.testing.assert_close(soft_targets(c, tau_y=1e-4), torch.eye(12), atol=1e-6, rtol=0)
    assert torch.equal(soft_targets(c, tau_y=0.1, hard=True), torch.eye(12))


def test_soft_target_rows_index_by_label_and_mask():
    c = _unit(5, 4, 4)
    labels = torch.tensor([3, 0, 3])
    rows = soft_target_rows(c, labels, tau_y=0.2)
    for b, k in enumerate(labels.tolist()):
        logits = [float(c[k] @ c[j]) / 0.2 for j in range(5)]
        z = sum(math.exp(v) for v in logits)
        torch.testing.assert_close(rows[b], torch.tensor([math.exp(v) / z for v in logits]))
    valid = torch.tensor([True, False, True, True, True])
    masked = soft_target_rows(c, labels, tau_y=0.2, valid=valid)
    assert torch.all(masked[:, 1] == 0)
    torch.testing.assert_close(masked[0, [0, 2, 3, 4]], rows[0, [0, 2, 3, 4]] / rows[0, [0, 2, 3, 4]].sum())
    with pytest.raises(ValueError, match="invalid"):
        soft_target_rows(c, torch.tensor([1]), tau_y=0.2, valid=valid)
    with pytest.raises(ValueError, match="tau_y"):
        soft_target_rows(c, labels, tau_y=0.0)


# --------------------------------------------------------------------------- PBT (Eq. 7)
def test_pbt_centroids_match_loop_and_count_empty():
    h = torch.randn(20, 3, generator=_gen(5))
    a = torch.tensor([0, 2, 2, 0, 4] * 4)
    cents, empty = pbt_centroids(h, a, 6)
    for k in range(6):
        members = [h[i] for i in range(20) if int(a[i]) == k]
        if members:
            torch.testing.assert_close(cents[k], sum(members) / len(members))
        else:
            assert torch.all(cents[k] == 0)
    assert empty.tolist() == [False, True, False, True, False, True]


# --------------------------------------------------------------------------- proto CE (Eqs. 3-4)
def test_proto_ce_matches_naive_loop():
    h, cls = _unit(4, 3, 6), torch.randn(5, 3, generator=_gen(7))
    targets = torch.softmax(torch.randn(4, 5, generator=_gen(8)), dim=1)
    scale = 3.0
    total = 0.0
    for i in range(4):
        logits = [scale * float(h[i] @ cls[k]) for k in range(5)]
        total -= sum(float(targets[i, k]) * _log_softmax_at(logits, k) for k in range(5))
    assert float(proto_ce(h, cls, targets, scale)) == pytest.approx(total / 4, rel=1e-5)
    # dropped prototypes leave the softmax: same as a classifier without those rows
    valid = torch.tensor([True, True, False, True, True])
    t2 = targets.clone()
    t2[:, 2] = 0
    t2 = t2 / t2.sum(1, keepdim=True)
    keep = [0, 1, 3, 4]
    assert float(proto_ce(h, cls, t2, scale, valid)) == pytest.approx(float(proto_ce(h, cls[keep], t2[:, keep], scale)), rel=1e-6)


# --------------------------------------------------------------------------- episode + ProtoLoss
class _FixedKMeans:
    """Stand-in k-means returning prescribed assignments (centroids = cluster means) in call order."""

    def __init__(self, *assignments: torch.Tensor):
        self.queue = list(assignments)

    def __call__(self, x, k, **kw):
        a = self.queue.pop(0)
        sums = torch.zeros(k, x.shape[1]).index_add_(0, a, x)
        sizes = torch.bincount(a, minlength=k)
        cent = sums / sizes.clamp_min(1)[:, None]
        return KMeansResult(cent, a, 0.0, sizes, int((sizes == 0).sum()), "fixed")


def _episode_data(m=24, d=6, dt=4):
    hi, ht = _unit(m, d, 10), _unit(m, d, 11)
    teacher = torch.randn(m, dt, generator=_gen(12))
    return hi, ht, teacher


def _loop_pbt(h: torch.Tensor, a: torch.Tensor, k: int) -> torch.Tensor:
    out = torch.zeros(k, h.shape[1])
    for j in range(k):
        idx = [i for i in range(h.shape[0]) if int(a[i]) == j]
        if idx:
            out[j] = h[idx].mean(0)
    return out


def test_hard_target_proto_loss_equals_index_cross_entropy():
    hi, ht, _ = _episode_data()
    ep = EpisodePrototypes.build(hi, ht, None, k=4, pbt=True, soft_targets=False, backend="torch", iters=5)
    pos = torch.tensor([3, 0, 17, 9, 9])
    bi, bt = _unit(5, 6, 20), _unit(5, 6, 21)
    scale = 5.0
    out = ProtoLoss()(bi, bt, pos, ep, torch.tensor(scale))
    a_i, a_t = ep.image.assignments, ep.text.assignments
    cls_i, cls_t = _loop_pbt(hi, a_t, 4), _loop_pbt(ht, a_i, 4)  # PBT: student-space means of teacher clusters
    assert ep.valid_image.all() and ep.valid_text.all()  # k-means (with splits) leaves no cluster empty here
    l_i2t = F.cross_entropy(scale * bi @ cls_i.T, a_t[pos])
    l_t2i = F.cross_entropy(scale * bt @ cls_t.T, a_i[pos])
    assert float(out["proto"]) == pytest.approx(float((l_i2t + l_t2i) / 2), rel=1e-5)
    assert float(out["proto_external"]) == 0.0


def test_soft_target_proto_loss_without_pbt_matches_loop():
    hi, ht, _ = _episode_data()
    a_img = torch.arange(24) % 3
    a_txt = torch.tensor([0, 1, 2, 3] * 6) % 4 % 3
    fixed = _FixedKMeans(a_img, a_txt)
    ep = EpisodePrototypes.build(hi, ht, None, k=3, pbt=False, soft_targets=True, tau_y=0.05, kmeans_fn=fixed)
    c_img = torch.stack([hi[a_img == j].mean(0) for j in range(3)])
    c_txt = torch.stack([ht[a_txt == j].mean(0) for j in range(3)])
    pos = torch.tensor([1, 5, 22])
    bi, bt, scale = _unit(3, 6, 30), _unit(3, 6, 31), 4.0
    got = ProtoLoss()(bi, bt, pos, ep, scale)["proto"]

    def direction(h, classifier, teacher_c, teacher_a):
        total = 0.0
        for b, p in enumerate(pos.tolist()):
            k = int(teacher_a[p])
            y = [math.exp(float(teacher_c[k] @ teacher_c[j]) / 0.05) for j in range(3)]
            y = [v / sum(y) for v in y]
            logits = [scale * float(h[b] @ classifier[j]) for j in range(3)]
            total -= sum(y[j] * _log_softmax_at(logits, j) for j in range(3))
        return total / len(pos)

    # no PBT: the image student is classified by the raw text prototypes C^T, and vice versa [Eq. 3]
    expected = (direction(bi, c_txt, c_txt, a_txt) + direction(bt, c_img, c_img, a_img)) / 2
    assert float(got) == pytest.approx(expected, rel=1e-5)


def test_external_term_and_empty_pbt_clusters():
    hi, ht, teacher = _episode_data()
    a_img = torch.arange(24) % 4
    a_txt = torch.tensor([0, 1, 3] * 8)  # text cluster 2 is empty -> image PBT classifier drops prototype 2
    a_ext = torch.arange(24) % 5
    ep = EpisodePrototypes.build(hi, ht, teacher, k=4, k_external=5, pbt=True, soft_targets=False,
                                 kmeans_fn=_FixedKMeans(a_img, a_txt, a_ext))
    st = ep.stats()
    assert st["pbt_dropped_i2t"] == 1.0 and st["pbt_dropped_t2i"] == 0.0 and st["pbt_dropped_i2ext"] == 0.0
    assert ep.valid_image.tolist() == [True, True, False, True]
    pos = torch.tensor([0, 7, 13, 23])
    bi, bt, scale = _unit(4, 6, 40), _unit(4, 6, 41), 2.5
    out = ProtoLoss()(bi, bt, pos, ep, scale)

    cls_ie, cls_te = _loop_pbt(hi, a_ext, 5), _loop_pbt(ht, a_ext, 5)
    e_i = F.cross_entropy(scale * bi @ cls_ie.T, a_ext[pos])  # hard targets on the teacher assignment [Eq. 8]
    e_t = F.cross_entropy(scale * bt @ cls_te.T, a_ext[pos])
    assert float(out["proto_external"]) == pytest.approx(float((e_i + e_t) / 2), rel=1e-5)

    keep = [0, 1, 3]  # image->text direction over the 3 non-empty text clusters only
    remap = {0: 0, 1: 1, 3: 2}
    cls_i = _loop_pbt(hi, a_txt, 4)[keep]
    l_i2t = F.cross_entropy(scale * bi @ cls_i.T, torch.tensor([remap[int(a_txt[p])] for p in pos]))
    l_t2i = F.cross_entropy(scale * bt @ _loop_pbt(ht, a_img, 4).T, a_img[pos])
    assert float(out["proto"]) == pytest.approx(float((l_i2t + l_t2i) / 2), rel=1e-5)
    assert torch.isfinite(out["proto"])


def test_gradients_reach_h_and_scale_but_not_prototypes():
    hi, ht, teacher = _episode_data()
    hi.requires_grad_(True)
    ht.requires_grad_(True)
    ep = EpisodePrototypes.build(hi, ht, teacher, k=4, backend="torch", iters=3)
    for t in (ep.cls_image, ep.cls_text, ep.cls_image_ext, ep.image.centroids, ep.text.centroids):
        assert not t.requires_grad
    log_scale = torch.nn.Parameter(torch.tensor(math.log(1 / 0.07)))
    bi = torch.randn(5, 6, generator=_gen(50), requires_grad=True)
    bt = torch.randn(5, 6, generator=_gen(51), requires_grad=True)
    out = ProtoLoss()(bi, bt, torch.arange(5), ep, log_scale.exp())
    (out["proto"] + out["proto_external"]).backward()
    for g in (bi.grad, bt.grad, log_scale.grad):
        assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0
    assert hi.grad is None and ht.grad is None


def test_random_prototypes_are_episode_samples():
    hi, ht, _ = _episode_data()
    ep = EpisodePrototypes.build(hi, ht, None, k=5, init="random", backend="torch", seed=1)
    for c in ep.image.centroids:
        assert torch.min((hi - c).abs().sum(1)) < 1e-6


def test_proto_loss_input_errors():
    hi, ht, _ = _episode_data()
    ep = EpisodePrototypes.build(hi, ht, None, k=3, backend="torch", iters=1)
    loss = ProtoLoss()
    with pytest.raises(ValueError, match="positions"):
        loss(hi[:2], ht[:2], torch.tensor([0, 24]), ep, 1.0)
    with pytest.raises(ValueError, match="teacher"):
        EpisodePrototypes.build(hi, ht, torch.zeros(5, 2), k=3, backend="torch")
    moved = ep.to("cpu")
    assert isinstance(moved, EpisodePrototypes) and torch.equal(moved.cls_image, ep.cls_image)


def test_non_finite_episode_features_name_episode_and_modality():
    from protoclip.prototypes.episode import EpisodePrototypes, NonFiniteFeaturesError

    g = torch.Generator().manual_seed(0)
    h_i, h_t = torch.randn(20, 8, generator=g), torch.randn(20, 8, generator=g)
    bad = h_t.clone()
    bad[3, 1] = float("nan")
    with pytest.raises(NonFiniteFeaturesError, match=r"episode 7: text \(h\^T\) features .* 1 of 20 rows"):
        EpisodePrototypes.build(h_i, bad, teacher=None, k=4, backend="torch", episode=7)
    bad_i = h_i.clone()
    bad_i[:, 0] = float("inf")
    with pytest.raises(NonFiniteFeaturesError, match=r"episode 2: image \(h\^I\) features .* 20 of 20 rows"):
        EpisodePrototypes.build(bad_i, h_t, teacher=None, k=4, backend="torch", episode=2)
    teacher = np.zeros((20, 5), dtype=np.float32)
    teacher[0, 0] = np.nan
    with pytest.raises(NonFiniteFeaturesError, match="episode 0: external teacher features.*teacher cache"):
        EpisodePrototypes.build(h_i, h_t, teacher=teacher, k=4, backend="torch", episode=0)
    assert EpisodePrototypes.build(h_i, h_t, teacher=None, k=4, backend="torch", episode=0).image is not None
