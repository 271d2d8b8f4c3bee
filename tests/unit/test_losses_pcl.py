"""PCL losses (protoclip.losses.pcl) against naive float64 computations written here, gradient checks, and the
momentum encoder / queue (protoclip.models.momentum)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from protoclip.losses.pcl import Clusterings, build_clusterings, concentration, infonce, protonce, sample_negatives
from protoclip.models.momentum import FeatureQueue, MomentumEncoder


def _unit(n, d, seed):
    return F.normalize(torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64), dim=1)


# --------------------------------------------------------------------------- InfoNCE
def test_infonce_known_answer():
    q, k, queue = _unit(5, 4, 0), _unit(5, 4, 1), _unit(7, 4, 2)
    tau = 0.2
    got = float(infonce(q, k, queue, tau)["infonce"])
    ref = 0.0
    for i in range(5):
        pos = math.exp(float(q[i] @ k[i]) / tau)
        neg = sum(math.exp(float(q[i] @ queue[j]) / tau) for j in range(7))
        ref += -math.log(pos / (pos + neg))
    assert got == pytest.approx(ref / 5, rel=1e-10)


def test_infonce_no_gradient_to_keys_or_queue():
    q = _unit(4, 3, 0).requires_grad_(True)
    k = _unit(4, 3, 1).requires_grad_(True)
    queue = _unit(6, 3, 2).requires_grad_(True)
    infonce(q, k, queue, 0.1)["infonce"].backward()
    assert q.grad is not None and q.grad.abs().sum() > 0
    assert k.grad is None and queue.grad is None


def test_infonce_gradcheck():
    k, queue = _unit(3, 4, 1), _unit(5, 4, 2)
    q = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: infonce(x, k, queue, 0.3)["infonce"], (q,))


# --------------------------------------------------------------------------- concentration phi
def _phi_naive(dist, assign, k, tau, alpha=10.0, clip=(10, 90)):
    """Straight transcription of the ref-code's run_kmeans density loop, numpy float64."""
    groups = [[] for _ in range(k)]
    for d, a in zip(dist, assign):
        groups[a].append(d)
    density = np.zeros(k)
    for i, ds in enumerate(groups):
        if len(ds) > 1:
            density[i] = np.mean(ds) / np.log(len(ds) + alpha)
    dmax = density.max()
    for i, ds in enumerate(groups):
        if len(ds) <= 1:
            density[i] = dmax
    density = density.clip(np.percentile(density, clip[0]), np.percentile(density, clip[1]))
    return tau * density / density.mean()


def test_concentration_matches_formula_and_ref_code_post_processing():
    rng = np.random.default_rng(0)
    k = 12
    assign = np.concatenate([rng.integers(0, 10, 80), [10]])  # cluster 10 a singleton, cluster 11 empty
    dist = rng.uniform(0.05, 0.9, len(assign))
    got = concentration(torch.from_numpy(dist), torch.from_numpy(assign), k, tau=0.1)
    ref = _phi_naive(dist, assign, k, 0.1)
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-12)
    assert float(got.mean()) == pytest.approx(0.1)


def test_concentration_without_clip_is_eq12_up_to_scale():
    dist = torch.tensor([0.1, 0.3, 0.2, 0.2, 0.2, 0.6], dtype=torch.float64)
    assign = torch.tensor([0, 0, 1, 1, 1, 1])
    got = concentration(dist, assign, 2, tau=1.0, clip_percentiles=None)
    raw = torch.tensor([0.4 / (2 * math.log(12)), 1.2 / (4 * math.log(14))], dtype=torch.float64)
    torch.testing.assert_close(got, raw / raw.mean())


def test_concentration_degenerate_is_tau():
    got = concentration(torch.zeros(3, dtype=torch.float64), torch.tensor([0, 1, 2]), 3, tau=0.2)
    torch.testing.assert_close(got, torch.full((3,), 0.2, dtype=torch.float64))


def test_build_clusterings_uses_project_kmeans_and_normalises(monkeypatch):
    import protoclip.losses.pcl as pcl
    from protoclip.prototypes.kmeans import kmeans

    calls = []

    def spy(*a, **kw):
        calls.append(kw.get("seed"))
        return kmeans(*a, **kw)

    monkeypatch.setattr(pcl, "kmeans", spy)  # the name losses.pcl calls: the project's one k-means
    x = _unit(60, 5, 3).float()
    cl = build_clusterings(x, [3, 6], tau=0.1, iters=5, nredo=2, seed=7, backend="torch")
    assert calls == [7, 8] and len(cl) == 2
    for c, a, phi, k in zip(cl.centroids, cl.assignments, cl.phi, [3, 6]):
        assert c.shape == (k, 5) and a.shape == (60,) and phi.shape == (k,)
        torch.testing.assert_close(c.norm(dim=1), torch.ones(k))
        assert float(phi.mean()) == pytest.approx(0.1, rel=1e-5)


# --------------------------------------------------------------------------- ProtoNCE
def test_sample_negatives_excludes_positives_and_is_deterministic():
    pos = torch.tensor([1, 4, 4, 7])
    a = sample_negatives(10, pos, 5, torch.Generator().manual_seed(3))
    b = sample_negatives(10, pos, 5, torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and len(set(a.tolist())) == 5 and not set(a.tolist()) & {1, 4, 7}
    assert len(sample_negatives(10, pos, 100, None)) == 7  # capped at the candidates


@pytest.mark.parametrize("mask", [False, True])
def test_protonce_known_answer(mask):
    k1, k2, d, b, r = 6, 9, 4, 5, 3
    cents = [_unit(k1, d, 10), _unit(k2, d, 11)]
    assigns = [torch.tensor([0, 1, 1, 2, 3, 4, 5, 0]), torch.tensor([8, 2, 2, 5, 1, 0, 3, 7])]
    phis = [torch.rand(k1, dtype=torch.float64) * 0.2 + 0.05, torch.rand(k2, dtype=torch.float64) * 0.2 + 0.05]
    cl = Clusterings(cents, assigns, phis)
    q = _unit(b, d, 12)
    positions = torch.tensor([7, 1, 2, 4, 3])
    got = protonce(q, positions, cl, r, torch.Generator().manual_seed(5), mask_duplicate_pos=mask)
    # redraw the same negatives with the same generator sequence
    g = torch.Generator().manual_seed(5)
    total = 0.0
    for c, a, phi in zip(cents, assigns, phis):
        pos = a[positions]
        neg = sample_negatives(c.shape[0], pos, r, g)
        cols = pos.tolist() + neg.tolist()
        for i in range(b):
            logits = []
            for j, col in enumerate(cols):
                if mask and j < b and j != i and int(pos[j]) == int(pos[i]):
                    continue
                logits.append(float(q[i] @ c[col]) / float(phi[col]))
            own = float(q[i] @ c[cols[i]]) / float(phi[cols[i]])
            total += -(own - math.log(sum(math.exp(x) for x in logits)))
    ref = total / (b * 2)
    assert float(got["protonce"]) == pytest.approx(ref, rel=1e-10)


def test_protonce_gradcheck():
    cl = Clusterings([_unit(5, 3, 1)], [torch.tensor([0, 2, 4, 1])], [torch.full((5,), 0.3, dtype=torch.float64)])
    q = torch.randn(3, 3, dtype=torch.float64, requires_grad=True)
    pos = torch.tensor([0, 1, 3])
    assert torch.autograd.gradcheck(
        lambda x: protonce(x, pos, cl, 2, torch.Generator().manual_seed(0))["protonce"], (q,))


# --------------------------------------------------------------------------- momentum encoder and queue
def test_momentum_update_is_ema_and_blocks_gradient():
    torch.manual_seed(0)
    online = torch.nn.Linear(3, 2)
    key = MomentumEncoder(online, momentum=0.9)
    before = [p.clone() for p in key.encoder.parameters()]
    with torch.no_grad():
        for p in online.parameters():
            p.add_(1.0)
    key.update(online)
    for pk, p0, pq in zip(key.encoder.parameters(), before, online.parameters()):
        torch.testing.assert_close(pk, 0.9 * p0 + 0.1 * pq)
        assert not pk.requires_grad
    x = torch.randn(4, 3, requires_grad=True)
    out = key(x)
    assert not out.requires_grad  # no graph through the key encoder
    (online(x).sum()).backward()
    assert all(p.grad is None for p in key.encoder.parameters())


def test_queue_enqueue_order_and_wraparound():
    qu = FeatureQueue(size=5, dim=2, seed=0)
    init = qu.queue.clone()
    torch.testing.assert_close(init.norm(dim=1), torch.ones(5))
    a = torch.arange(6.0).view(3, 2)
    qu.enqueue(a)
    assert int(qu.ptr) == 3
    torch.testing.assert_close(qu.queue[:3], a)
    torch.testing.assert_close(qu.queue[3:], init[3:])  # the oldest rows are overwritten first
    b = 10 + torch.arange(6.0).view(3, 2)
    qu.enqueue(b)  # rows 3, 4, then wraps to 0
    assert int(qu.ptr) == 1
    torch.testing.assert_close(qu.queue[3:], b[:2])
    torch.testing.assert_close(qu.queue[0], b[2])
    torch.testing.assert_close(qu.queue[1:3], a[1:])
    state = qu.state_dict()
    qu2 = FeatureQueue(size=5, dim=2, seed=1)
    qu2.load_state_dict(state)
    assert torch.equal(qu2.queue, qu.queue) and int(qu2.ptr) == 1


def test_phi_proto_ce_known_answer_and_mask():
    from protoclip.losses.pcl import phi_proto_ce, relative_concentration

    h, c = _unit(4, 3, 20), _unit(5, 3, 21)
    labels = torch.tensor([0, 2, 2, 4])
    valid = torch.tensor([True, False, True, True, True])
    phi = torch.tensor([0.5, 1.0, 1.5, 0.8, 1.2], dtype=torch.float64)
    got = float(phi_proto_ce(h, c, labels, phi, 7.0, valid))
    ref = 0.0
    for i in range(4):
        logits = [7.0 * float(h[i] @ c[j]) / float(phi[j]) for j in range(5) if valid[j]]
        own = 7.0 * float(h[i] @ c[labels[i]]) / float(phi[labels[i]])
        ref += -(own - math.log(sum(math.exp(x) for x in logits)))
    assert got == pytest.approx(ref / 4, rel=1e-10)
    members = _unit(40, 3, 22)
    lab = torch.arange(40) % 5
    rel = relative_concentration(members, c, lab)
    dist = (members - c[lab]).norm(dim=1)
    torch.testing.assert_close(rel.double(), concentration(dist, lab, 5, tau=1.0), rtol=1e-6, atol=1e-6)
    assert float(rel.mean()) == pytest.approx(1.0, rel=1e-6)


def test_drawn_negatives_as_stated_where_k_allows():
    """Training runs draw the papers' r wherever every K leaves r others (r <= K_min - 1), else K_min - 1."""
    from protoclip.losses.pcl import PCL_NEGATIVES, drawn_negatives

    # PCL l.150: r = 16000 with K = {25000, 50000, 100000}; PAUC l.158: r = 1024 with K = {2500, 5000, 10000}
    assert drawn_negatives(PCL_NEGATIVES, [25_000, 50_000, 100_000]) == 16_000
    assert drawn_negatives(1024, [2_500, 5_000, 10_000]) == 1024
    assert drawn_negatives(16000, [16_001, 20_000]) == 16000  # exactly r others to sample
    assert drawn_negatives(16000, [16_000, 20_000]) == 15_999  # K_min <= r: all K_min - 1 others
    assert drawn_negatives(16000, [9, 7, 20]) == 6
    cl = Clusterings([_unit(6, 3, 0), _unit(11, 3, 1)], [torch.zeros(4, dtype=torch.long)] * 2,
                     [torch.ones(6), torch.ones(11)])
    assert drawn_negatives(100, cl) == 5 and drawn_negatives(4, cl) == 4
    with pytest.raises(ValueError, match="r >= 1"):
        drawn_negatives(0, [10])


def test_capped_negatives_half_the_smallest_k():
    """methods-spec 4.7.5's rule, kept by the toy PAUC / NEMD study only."""
    from protoclip.losses.pcl import PCL_NEGATIVES, capped_negatives

    assert capped_negatives(PCL_NEGATIVES, [25_000, 50_000, 100_000]) == 12_500  # the paper's K: 16000 > 25000 / 2
    assert capped_negatives(16000, [40_000, 50_000]) == 16000
    assert capped_negatives(16000, [9, 7, 20]) == 3  # floor(7 / 2)
    assert capped_negatives(16000, [1]) == 1  # at least one negative
    cl = Clusterings([_unit(6, 3, 0), _unit(11, 3, 1)], [torch.zeros(4, dtype=torch.long)] * 2,
                     [torch.ones(6), torch.ones(11)])
    assert capped_negatives(100, cl) == 3
    with pytest.raises(ValueError, match="r >= 1"):
        capped_negatives(0, [10])
