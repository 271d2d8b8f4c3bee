"""nCLIP loss (nclip-xclip.txt Eqs. 2-4, methods-spec 1.2): known answers against a float64 loop, gradients,
no stop-gradient, the collapse behaviour of the mean-entropy term, diagnostics and the CE similarity."""
from __future__ import annotations

import math

import pytest
import torch

from protoclip.losses.nclip import NCLIPLoss, nclip_similarity, nclip_stats
from protoclip.models.model import NCLIPHead


def naive_terms(hi: torch.Tensor, ht: torch.Tensor, lam1: float, lam2: float) -> dict[str, float]:
    """Independent float64 loops over samples and units."""
    hi, ht = hi.double().tolist(), ht.double().tolist()
    B, K = len(hi), len(hi[0])

    def softmax(row):
        m = max(row)
        e = [math.exp(v - m) for v in row]
        s = sum(e)
        return [v / s for v in e]

    P, Q = [softmax(r) for r in hi], [softmax(r) for r in ht]
    ce = eh = 0.0
    for p, q in zip(P, Q):
        ce += -sum(p[k] * math.log(q[k]) for k in range(K)) - sum(q[k] * math.log(p[k]) for k in range(K))
        eh += -sum(p[k] * math.log(p[k]) for k in range(K)) - sum(q[k] * math.log(q[k]) for k in range(K))
    ce, eh = ce / (2 * B), eh / (2 * B)
    he = 0.0
    for D in (P, Q):
        pbar = [sum(D[i][k] for i in range(B)) / B for k in range(K)]
        he += -sum(v * math.log(v) for v in pbar)
    he /= 2
    return {"nclip": ce + lam1 * eh - lam2 * he, "nclip_ce": ce, "nclip_eh": eh, "nclip_he": he, "nclip_kl": ce - eh}


@pytest.mark.parametrize("lam1,lam2", [(0.5, 1.5), (0.2, 1.2), (0.0, 0.0)])
def test_terms_match_float64_loop(lam1, lam2):
    g = torch.Generator().manual_seed(0)
    hi, ht = 2 * torch.randn(6, 5, generator=g), 2 * torch.randn(6, 5, generator=g)
    got = NCLIPLoss(lam1, lam2)(hi, ht)
    want = naive_terms(hi, ht, lam1, lam2)
    for k, v in want.items():
        assert float(got[k]) == pytest.approx(v, rel=1e-5, abs=1e-6), k


def test_paper_identity_kl_plus_mutual_information():
    """App. B.1: with lambda1 = lambda2 - 1, L_nCLIP = L_KL + lambda2 (L_EH - L_HE)."""
    g = torch.Generator().manual_seed(1)
    hi, ht = torch.randn(8, 7, generator=g), torch.randn(8, 7, generator=g)
    t = NCLIPLoss(0.5, 1.5)(hi, ht)
    assert float(t["nclip"]) == pytest.approx(float(t["nclip_kl"] + 1.5 * (t["nclip_eh"] - t["nclip_he"])), rel=1e-5)


def test_gradcheck_float64_both_sides():
    g = torch.Generator().manual_seed(2)
    hi = torch.randn(4, 3, generator=g, dtype=torch.float64, requires_grad=True)
    ht = torch.randn(4, 3, generator=g, dtype=torch.float64, requires_grad=True)
    loss = NCLIPLoss(0.5, 1.5)
    for name in ("nclip", "nclip_ce", "nclip_eh", "nclip_he"):
        assert torch.autograd.gradcheck(lambda a, b: loss(a, b)[name], (hi, ht), eps=1e-6, atol=1e-6), name
    # the float32 path's gradient against a central difference of the independent float64 loop
    hi32, ht32 = hi.detach().float().requires_grad_(), ht.detach().float().requires_grad_()
    loss(hi32, ht32)["nclip"].backward()
    eps = 1e-4
    for which, grad in ((0, hi32.grad), (1, ht32.grad)):
        for idx in [(0, 0), (1, 2), (3, 1)]:
            args_p, args_m = [hi.detach().clone(), ht.detach().clone()], [hi.detach().clone(), ht.detach().clone()]
            args_p[which][idx] += eps
            args_m[which][idx] -= eps
            fd = (naive_terms(*args_p, 0.5, 1.5)["nclip"] - naive_terms(*args_m, 0.5, 1.5)["nclip"]) / (2 * eps)
            assert float(grad[idx]) == pytest.approx(fd, rel=1e-3, abs=1e-5)


def test_no_stop_gradient_on_either_side():
    """The CE term alone moves both modalities (target and prediction are both backpropagated)."""
    g = torch.Generator().manual_seed(3)
    hi = torch.randn(5, 4, generator=g, requires_grad=True)
    ht = torch.randn(5, 4, generator=g, requires_grad=True)
    NCLIPLoss(0.0, 0.0)(hi, ht)["nclip"].backward()
    assert hi.grad.abs().sum() > 0 and ht.grad.abs().sum() > 0


def test_runs_in_float32_under_autocast():
    hi, ht = torch.randn(4, 6).bfloat16(), torch.randn(4, 6).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        t = NCLIPLoss()(hi, ht)
    assert all(v.dtype == torch.float32 for v in t.values())


def _train_linear_heads(lam1: float, lam2: float, steps: int = 200) -> dict[str, float]:
    torch.manual_seed(0)
    B, D, K = 32, 4, 8
    x = 0.3 * torch.randn(B, D)
    y = x + 0.1 * torch.randn(B, D)
    hi, ht = torch.nn.Linear(D, K), torch.nn.Linear(D, K)
    opt = torch.optim.SGD([*hi.parameters(), *ht.parameters()], lr=0.5)
    loss = NCLIPLoss(lam1, lam2)
    for _ in range(steps):
        t = loss(hi(x), ht(y))
        opt.zero_grad()
        t["nclip"].backward()
        opt.step()
    return {k: float(v.detach()) for k, v in t.items()}


def test_mean_entropy_term_prevents_collapse():
    """Without lambda2 every sample falls into one cluster (H(pbar) -> 0); the paper's values keep pbar
    close to uniform (H(pbar) near log K = 2.08) on the same problem."""
    collapsed = _train_linear_heads(0.5, 0.0)
    kept = _train_linear_heads(0.5, 1.5)
    assert collapsed["nclip_he"] < 0.2
    assert kept["nclip_he"] > 0.9 * math.log(8)


def test_pbar_batch_size_is_logged():
    loss = NCLIPLoss()
    loss(torch.randn(6, 5), torch.randn(6, 5))
    assert loss.last_stats["nclip_pbar_batch"] == 6.0  # single process: the local batch


def test_stats_std_and_same_argmax():
    p = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1]])
    q = torch.tensor([[0.6, 0.3, 0.1], [0.5, 0.4, 0.1]])
    s = nclip_stats(p, q)
    assert s["nclip_acc_same_argmax"] == 50.0
    assert s["nclip_row_std_image"] == pytest.approx(float(p.std(1).mean()))
    assert s["nclip_col_std_text"] == pytest.approx(float(q.std(0).mean()))
    u = torch.full((2, 3), 1 / 3)
    assert nclip_stats(u, u)["nclip_row_std_image"] == 0.0  # uniform collapse -> row std 0


def test_similarity_is_minus_symmetric_cross_entropy():
    g = torch.Generator().manual_seed(4)
    li, lt = torch.log_softmax(torch.randn(3, 5, generator=g), 1), torch.log_softmax(torch.randn(4, 5, generator=g), 1)
    s = nclip_similarity(li, lt)
    for i in range(3):
        for j in range(4):
            want = 0.5 * float((li[i].exp() * lt[j]).sum() + (lt[j].exp() * li[i]).sum())
            assert float(s[i, j]) == pytest.approx(want, rel=1e-5)


def test_head_layers_and_non_affine_last_bn():
    head = NCLIPHead(8, 16, 32)
    kinds = [type(m).__name__ for m in head]
    assert kinds == ["Linear", "BatchNorm1d", "GELU", "Linear", "BatchNorm1d"]
    assert head[1].affine and not head[4].affine
    out = head.train()(torch.randn(10, 8))
    assert out.shape == (10, 32)
    assert torch.allclose(out.mean(0), torch.zeros(32), atol=1e-5)  # BN without affine: zero-mean units


def test_ddp_batch_mean_is_global_with_gradient(tmp_path):
    """Two gloo ranks with half a batch each: H(pbar) is the whole batch's, the per-rank CE/EH means average to
    the whole batch's, and each rank's feature gradient is world x the single-process one (DDP then averages)."""

    import torch.multiprocessing as mp

    from testkit.training import free_port, global_nclip_worker

    mp.spawn(global_nclip_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    g = torch.Generator().manual_seed(0)
    hi = torch.randn(8, 6, generator=g).requires_grad_(True)
    ht = torch.randn(8, 6, generator=g).requires_grad_(True)
    oracle = NCLIPLoss(0.5, 1.5)(hi, ht)
    oracle["nclip"].backward()
    got = [torch.load(tmp_path / f"nclip{r}.pt") for r in range(2)]
    for r in range(2):
        torch.testing.assert_close(got[r]["terms"]["nclip_he"], oracle["nclip_he"].detach())
        torch.testing.assert_close(got[r]["gi"], 2 * hi.grad[r * 4:(r + 1) * 4])
        torch.testing.assert_close(got[r]["gt"], 2 * ht.grad[r * 4:(r + 1) * 4])
    for k in ("nclip_ce", "nclip_eh", "nclip"):
        torch.testing.assert_close((got[0]["terms"][k] + got[1]["terms"][k]) / 2, oracle[k].detach())
    assert [got[r]["stats"]["nclip_pbar_batch"] for r in range(2)] == [8.0, 8.0]  # 2 ranks x 4: the global batch


def test_evaluation_score_exact_for_sharp_head_logits():
    """The evaluation's dot-product form of -L_CE (nCLIP's similarity, prompt ensemble = mean probability) equals
    a float64 computation even when head logits are sharp (sd 20: float32 softmax underflows to 0, and the old
    log(clamp(softmax)) picked another class for ~4% of images)."""
    from protoclip.train.methods.nclip import NCLIPCrossEntropy

    g = torch.Generator().manual_seed(7)
    K, n_img, n_cls, n_prompts = 64, 200, 10, 3
    hi = 20 * torch.randn(n_img, K, generator=g)
    ht = 20 * torch.randn(n_cls, n_prompts, K, generator=g)
    sim = NCLIPCrossEntropy()
    img = sim.image(None, hi)
    cls = torch.cat([sim.text(sim.ensemble(sim.pre(None, ht[c]))) for c in range(n_cls)])
    got = (img @ cls.T).double()

    def logp64(h):  # float64 log-softmax by hand
        h = h.double()
        m = h.max(-1, keepdim=True).values
        return h - m - (h - m).exp().sum(-1, keepdim=True).log()

    lp_i = logp64(hi)
    lp_t = (logp64(ht).exp().mean(1)).log()  # log of the prompts' mean probability, float64
    want = 0.5 * (lp_i.exp() @ lp_t.T + lp_i @ lp_t.exp().T)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-3)
    assert torch.equal(got.argmax(1), want.argmax(1))


def test_zeroshot_logs_the_image_as_target_variant(tmp_path):
    """The zero-shot task of an nCLIP run adds image_as_target: top-k of p_I . log p_T (image distribution as the
    target, spec 1.7.4), here against a float64 argmax; the headline stays the symmetric score."""
    from protoclip.evaluate.adapters import SetInput
    from protoclip.evaluate.tasks.zeroshot import task_zeroshot
    from protoclip.evaluate.config import EvaluateConfig
    from protoclip.evaluate.set_features import SetFeatures
    from protoclip.train.methods.nclip import NCLIPCrossEntropy

    g = torch.Generator().manual_seed(8)
    hi, ht = 3 * torch.randn(40, 16, generator=g), 3 * torch.randn(6, 2, 16, generator=g)
    y = torch.randint(0, 6, (40,), generator=g)
    sim = NCLIPCrossEntropy()
    cls = torch.cat([sim.text(sim.ensemble(sim.pre(None, ht[c]))) for c in range(6)])
    f = SetFeatures(test_s=sim.image(None, hi).numpy(), test_y=y.numpy())
    ds = type("DS", (), {"classnames": list("abcdef"), "templates": ["{}", "a {}"]})()
    # the classifier as the zero-shot task builds it from the text tower: given here from the head logits
    m = task_zeroshot(SetInput(f, ds, EvaluateConfig(), tmp_path, sim, classifiers={"s": cls.numpy()})).metrics
    p_i = torch.softmax(hi.double(), 1)
    logq = torch.softmax(ht.double(), 2).mean(1).log()
    want_target = 100.0 * float(((p_i @ logq.T).argmax(1) == y).double().mean())
    want_sym = 100.0 * float((nclip_similarity(p_i.log(), logq).argmax(1) == y).double().mean())
    assert m["image_as_target"]["top1"] == pytest.approx(want_target) and m["top1"] == pytest.approx(want_sym)
    text_target = 100.0 * float(((p_i.log() @ logq.exp().T).argmax(1) == y).double().mean())
    assert len({want_target, want_sym, text_target}) == 3  # the fixture tells the three scores apart
