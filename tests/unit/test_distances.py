"""CLIP-loss distances (temperature paper Table 1, Fig. 6; methods-spec 2.2) against hand-computed values,
the symmetric loss against a float64 loop, gradients, and the temperature statistics."""
from __future__ import annotations

import math

import pytest
import torch

from protoclip.losses.distances import GEODESIC_EPS, contrastive_loss, neg_distance, product_sphere, temperature_stats
from protoclip.train.config import DEFAULT_MAX_SCALE


def test_sphere_and_euclidean_hand_values():
    u = torch.tensor([[3.0, 4.0]])
    v = torch.tensor([[4.0, 3.0], [0.0, -2.0]])
    assert neg_distance(u, v, "sphere").tolist()[0] == pytest.approx([24 / 25, -8 / 10])
    assert neg_distance(u, v, "euclidean").tolist()[0] == pytest.approx([-math.sqrt(2), -math.sqrt(9 + 36)])


def test_product_sphere_negtrace_hand_values():
    # PS(2, 2): chunks [3,4] and [0,2] -> [.6,.8] and [0,1]; v chunks [1,0] and [0,-5] -> [1,0] and [0,-1]
    u = torch.tensor([[3.0, 4.0, 0.0, 2.0]])
    v = torch.tensor([[1.0, 0.0, 0.0, -5.0]])
    assert product_sphere(u, 2)[0].flatten().tolist() == pytest.approx([0.6, 0.8, 0.0, 1.0])
    assert float(neg_distance(u, v, "ps_negtrace", 2)) == pytest.approx(0.6 - 1.0)
    assert float(neg_distance(u, u, "ps_negtrace", 2)) == pytest.approx(2.0)  # maximum m
    # sum of per-chunk arccos^2 under the root: acos(0.6)^2 + acos(-1)^2 (clamped at -1 + eps)
    want = -math.sqrt(math.acos(0.6) ** 2 + math.acos(-1 + GEODESIC_EPS) ** 2)
    assert float(neg_distance(u, v, "ps_geodesic", 2)) == pytest.approx(want, rel=1e-5)


def test_geodesic_at_identical_and_antipodal_points():
    g = torch.Generator().manual_seed(0)
    u = torch.randn(3, 12, generator=g)
    m = 4
    same = -neg_distance(u, u, "ps_geodesic", m).diagonal()
    assert torch.allclose(same, torch.full((3,), math.sqrt(m) * math.acos(1 - GEODESIC_EPS)), atol=2e-4)
    assert float(same.max()) < 5e-3  # ~0 (the clamp keeps the gradient finite)
    anti = -neg_distance(u, -u, "ps_geodesic", m).diagonal()
    assert torch.allclose(anti, torch.full((3,), math.sqrt(m) * math.pi), atol=5e-3)  # true max sqrt(m) pi
    x = u.clone().requires_grad_(True)
    neg_distance(x, x.detach(), "ps_geodesic", m).sum().backward()
    assert torch.isfinite(x.grad).all()


def test_single_subsphere_negtrace_is_cosine():
    g = torch.Generator().manual_seed(1)
    u, v = torch.randn(4, 6, generator=g), torch.randn(5, 6, generator=g)
    assert torch.allclose(neg_distance(u, v, "ps_negtrace", 1), neg_distance(u, v, "sphere"), atol=1e-6)


def naive_loss(u, v, scale, distance, m):
    s = neg_distance(u.double(), v.double(), distance, m).tolist()
    B = len(s)
    total = 0.0
    for i in range(B):
        row = [scale * s[i][j] for j in range(B)]
        col = [scale * s[j][i] for j in range(B)]
        total += -row[i] + math.log(sum(math.exp(r) for r in row))
        total += -col[i] + math.log(sum(math.exp(c) for c in col))
    return total / (2 * B)


@pytest.mark.parametrize("distance,m", [("sphere", 1), ("euclidean", 1), ("ps_negtrace", 3), ("ps_geodesic", 3)])
def test_contrastive_loss_matches_float64_loop_and_gradcheck(distance, m):
    g = torch.Generator().manual_seed(2)
    u = torch.randn(5, 6, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(5, 6, generator=g, dtype=torch.float64, requires_grad=True)
    scale = torch.tensor(3.0, dtype=torch.float64, requires_grad=True)
    got = contrastive_loss(u, v, scale, distance, m)
    assert float(got.detach()) == pytest.approx(naive_loss(u.detach(), v.detach(), 3.0, distance, m), rel=1e-9)
    assert torch.autograd.gradcheck(lambda a, b, s: contrastive_loss(a, b, s, distance, m), (u, v, scale),
                                    eps=1e-6, atol=1e-5)


def test_sphere_loss_equals_open_clip_clip_loss():
    from protoclip.losses.clip import clip_loss

    g = torch.Generator().manual_seed(3)
    u, v = torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g)
    assert float(contrastive_loss(u, v, torch.tensor(10.0))) == pytest.approx(float(clip_loss(u, v, 10.0)["clip"]),
                                                                                rel=1e-5)


def test_equilibrium_statistic_is_minus_scale_gradient():
    """mean(s_ii - E_p s_ij) over both directions = -dL/dscale (spec 2.2 temperature gradient)."""
    g = torch.Generator().manual_seed(4)
    u, v = torch.randn(7, 8, generator=g), torch.randn(7, 8, generator=g)
    for distance, m in (("sphere", 1), ("ps_negtrace", 4)):
        scale = torch.tensor(2.5, requires_grad=True)
        contrastive_loss(u, v, scale, distance, m).backward()
        stats = temperature_stats(u, v, 2.5, distance, m)
        assert stats["equilibrium"] == pytest.approx(-float(scale.grad), rel=1e-4, abs=1e-6)
    perfect = temperature_stats(torch.eye(4), torch.eye(4), 5.0)
    assert perfect["clip_acc_i2t"] == 100.0 and perfect["equilibrium"] > 0


def test_default_clamps():
    assert DEFAULT_MAX_SCALE["sphere"] == 100.0 and DEFAULT_MAX_SCALE["ps_negtrace"] == 3.95


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="m=3"):
        neg_distance(torch.randn(2, 8), torch.randn(2, 8), "ps_negtrace", 3)
    with pytest.raises(ValueError, match="unknown distance"):
        neg_distance(torch.randn(2, 8), torch.randn(2, 8), "hyperbolic")


def test_euclidean_exact_on_near_zero_distances_in_float32():
    """Batches above 25 switch cdist's default to the matmul form, whose float32 cancellation loses pairs
    8e-4 apart; the distance must match float64 differences to float32 rounding, with finite zero-distance grads."""
    g = torch.Generator().manual_seed(5)
    u = torch.randn(64, 512, generator=g)
    v = u.clone()
    v[:, 0] += 8e-4
    want = -torch.sqrt(((u.double()[:, None, :] - v.double()[None, :, :]) ** 2).sum(-1))  # naive float64
    got = neg_distance(u, v, "euclidean").double()
    assert float((got.diagonal() - want.diagonal()).abs().max()) < 1e-6
    assert float((got - want).abs().max()) < 1e-4  # off-diagonal distances ~32: float32 rounding only
    x = u.clone().requires_grad_(True)
    neg_distance(x, x.detach(), "euclidean").diagonal().sum().backward()  # every pair at distance 0
    assert torch.equal(x.grad, torch.zeros_like(x))
