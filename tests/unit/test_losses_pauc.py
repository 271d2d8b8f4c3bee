"""PAUC regularisers (protoclip.losses.pauc) against naive float64 loops written from methods-spec 3.3."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from protoclip.losses.pauc import pauc_loss, pauc_terms
from protoclip.losses.pcl import Clusterings


def _data(seed=0):
    g = torch.Generator().manual_seed(seed)
    v = F.normalize(torch.randn(7, 4, generator=g, dtype=torch.float64), dim=1)
    v2 = F.normalize(torch.randn(7, 4, generator=g, dtype=torch.float64), dim=1)
    c = torch.randn(5, 4, generator=g, dtype=torch.float64)
    a = torch.tensor([3, 0, 3, 1, 4, 0, 3])
    return v, v2, c, a


def _naive(v, a, c, s, t, tau_c, v2=None, unif_log=False):
    ids = sorted(set(a.tolist()))

    def proto(x, p):
        m = [x[i].tolist() for i in range(len(a)) if int(a[i]) == p]
        mean = [sum(col) / len(m) for col in zip(*m)]
        n = math.sqrt(sum(u * u for u in mean))
        return [u / n for u in mean]

    chat = {p: proto(v, p) for p in ids}
    if v2 is None:
        cn = [[u / math.sqrt(sum(w * w for w in row)) for u in row] for row in c.tolist()]
        align = sum(sum((v[i, d].item() - cn[int(a[i])][d]) ** 2 for d in range(v.shape[1])) ** (s / 2)
                    for i in range(len(a))) / len(a)
    else:
        chat2 = {p: proto(v2, p) for p in ids}
        align = sum(sum((x - y) ** 2 for x, y in zip(chat[p], chat2[p])) ** (s / 2) for p in ids) / len(ids)
    pairs = [(p, q) for p in ids for q in ids if p != q]
    kern = [math.exp(-t * sum((x - y) ** 2 for x, y in zip(chat[p], chat[q]))) for p, q in pairs]
    unif = sum(kern) / len(kern)
    if unif_log:
        unif = math.log(unif)

    def softmax(x):
        e = [math.exp(u / tau_c) for u in x]
        return [u / sum(e) for u in e]

    pi = {p: softmax(chat[p]) for p in ids}
    corr = sum(sum(pi[p][d] * math.log(pi[q][d] / pi[p][d]) for d in range(len(pi[p]))) for p, q in pairs) / len(pairs)
    return align, unif, corr


@pytest.mark.parametrize("s,t,tau_c,unif_log", [(2.0, 2.0, 0.1, False), (1.0, 0.5, 0.5, True)])
def test_pauc_terms_anchor_known_answer(s, t, tau_c, unif_log):
    v, _, c, a = _data()
    got = pauc_terms(v, a, c, s=s, t=t, tau_c=tau_c, unif_log=unif_log)
    ref = _naive(v, a, c, s, t, tau_c, unif_log=unif_log)
    for name, r in zip(("pauc_align", "pauc_unif", "pauc_corr"), ref):
        assert float(got[name]) == pytest.approx(r, rel=1e-10), name
    assert float(got["pauc_corr"]) <= 0  # -KL: minimising it pushes the prototype distributions apart


def test_pauc_terms_two_view_known_answer():
    v, v2, c, a = _data(1)
    got = pauc_terms(v, a, align_mode="two_view", v2=v2)
    assert float(got["pauc_align"]) == pytest.approx(_naive(v, a, c, 2.0, 2.0, 0.1, v2=v2)[0], rel=1e-10)


def test_pauc_single_cluster_has_zero_pair_terms_but_keeps_graph():
    v, _, c, _ = _data()
    v = v.clone().requires_grad_(True)
    got = pauc_terms(v, torch.zeros(7, dtype=torch.long), c)
    assert float(got["pauc_unif"].detach()) == 0 and float(got["pauc_corr"].detach()) == 0
    sum(got.values()).backward()
    assert v.grad is not None


@pytest.mark.parametrize("name", ["pauc_align", "pauc_unif", "pauc_corr"])
def test_pauc_gradcheck(name):
    _, _, c, a = _data(2)
    x = torch.randn(7, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda z: pauc_terms(z, a, c, tau_c=0.5)[name], (x,))


def test_pauc_gradient_directions():
    """Gradient descent on uniformity spreads the batch prototypes; on alignment pulls v to its centroid."""
    v, _, c, a = _data(3)
    x = v.clone().requires_grad_(True)
    for _ in range(50):
        terms = pauc_terms(x, a, c)
        (terms["pauc_unif"]).backward()
        with torch.no_grad():
            x -= 0.1 * x.grad
            x.grad = None
    assert float(pauc_terms(x.detach(), a, c)["pauc_unif"]) < float(pauc_terms(v, a, c)["pauc_unif"])
    x = v.clone().requires_grad_(True)
    pauc_terms(x, a, c)["pauc_align"].backward()
    with torch.no_grad():
        y = x - 0.05 * x.grad
    assert float(pauc_terms(y, a, c)["pauc_align"]) < float(pauc_terms(v, a, c)["pauc_align"])


def test_pauc_loss_averages_over_clusterings():
    v, _, c, a = _data(4)
    c2 = torch.randn(3, 4, dtype=torch.float64)
    a_all = [torch.cat([a, a]), torch.tensor([0, 1, 2, 0, 1, 2, 0] * 2)]
    cl = Clusterings([c, c2], a_all, [torch.ones(5), torch.ones(3)])
    pos = torch.arange(7, 14)
    got = pauc_loss(v, pos, cl)
    t1, t2 = pauc_terms(v, a_all[0][pos], c), pauc_terms(v, a_all[1][pos], c2)
    for k in got:
        assert float(got[k]) == pytest.approx((float(t1[k]) + float(t2[k])) / 2, rel=1e-12)
