"""Every paper run (config/paper.yaml + config/experiments/paper_*.yaml) against what the paper fixes.

Sources: ProtoCLIP (shared/papers/protoclip.txt) Table I (hyper-parameters), Sec. IV-A (architecture,
context length 76, locking at 16 of 32 epochs, early stop), Sec. IV-B3 (augmentation), Sec. IV-D / Fig. 6
(1M CC subset, 20 epochs, defaults m = 0.2M, hard targets, 10 images per prototype, no teacher, no
augmentation; one sweep per panel), Tables III-IV (CC2.5M: 8-epoch ablations; 16/32 ProtoCLIP, 32/64 CLIP),
Tables V-IX (YFCC: ProtoCLIP RN50 and RN101, "8 (10.8)" epochs), Fig. 7 (CLIP on CC2.5M subsets). A field is
checked for every run unless the run's sweep varies it on purpose (listed per run below). config/paper.yaml is
what the paper DAG's jobs read, alone (tests/e2e/test_config_model.py checks that through Snakemake).
"""
from __future__ import annotations

import pytest

from protoclip.project import load_config
from protoclip.models.build import model_config
from protoclip.train.schedule import Schedule
from testkit import REPO

CFG = load_config(REPO / "config" / "paper.yaml")
# the related methods' runs (nCLIP / xCLIP / multi-token, temperature, PCL / PAUC): checked against RELATED below
RELATED_PREFIXES = ("pm_", "pt_", "pcl_", "pauc_")
# ProtoCLIP's own tables and figures; the released checkpoints (`pretrained:`, Tables V-VIII's CLIP rows: OpenCLIP's
# YFCC-15M RN50 / RN101, not trained here) are checked in tests/unit/test_pretrained_runs.py
RUNS = [n for n in CFG.run_names() if not n.startswith(RELATED_PREFIXES) and not CFG.run(n).pretrained.enabled]

# Fig. 6 panels: the field each sweep varies on purpose
F6_SWEEP = {"f6a": "episode_size", "f6b": "tau_y", "f6c": "images_per_prototype", "f6d": "teacher"}


def expected(name: str) -> dict:
    """What the paper fixes for run ``name`` (None = not fixed by the paper for this run)."""
    exp = {"data": None, "epochs": None, "augmentation": "protoclip", "teacher": "roberta-large",
           "episode_size": 200_000, "images_per_prototype": 10, "tau_y": 0.01, "lock": None}
    if name.startswith("f6"):
        exp.update(data=["cc1m"], epochs=20.0, augmentation="none", teacher=None, lock="none")
        panel = name[:3]
        if panel in ("f6a", "f6c", "f6d"):
            exp["tau_y"] = None  # hard targets: tau_y unused (Fig. 6 default "no soft target")
        exp[F6_SWEEP[panel]] = "sweep"
    elif name.startswith(("t3_", "t10_", "t11_")):
        exp.update(data=["cc2.5m"], epochs=8.0)  # Table III: 8 epochs; X and XI are run on the same setting
    elif name.startswith("t4_"):
        exp.update(data=["cc2.5m"], epochs=float(name.split("_")[-1].removesuffix("ep")))
        exp["lock"] = exp["epochs"] / 2  # Sec. IV-A2: 16 of 32 (the same half for the other lengths: ours)
    elif name.startswith("f7_"):  # Fig. 7: CLIP on CC2.5M subsets, t4_clip_32ep's recipe (sizes, schedule: ours)
        exp.update(data=["cc2.5m"], epochs=32.0, lock=16.0)
    elif name.startswith("yfcc_"):
        exp.update(data=["yfcc14m"], epochs=8.0, lock=4.0)  # Tables V-IX: 8 (10.8) for RN50 and RN101
    else:
        raise AssertionError(f"paper run {name!r} belongs to no known table or figure: add it here")
    return exp


def test_every_table_and_figure_has_its_runs():
    names = set(RUNS)
    assert {"t3_clip", "t3_protoclip", "t3_no_roberta", "t3_no_roberta_no_pbt", "t3_no_roberta_no_soft_target",
            "t3_no_roberta_no_kmeans", "t3_no_roberta_no_augmentation"} <= names  # Table III rows
    assert {"t4_protoclip_16ep", "t4_clip_32ep", "t4_protoclip_32ep", "t4_clip_64ep"} <= names  # Table IV
    assert sorted(CFG.run(n).subset_fraction for n in names if n.startswith("f7_")) == [0.1, 0.25, 0.5]  # Fig. 7
    assert {"yfcc_protoclip_rn50_8ep", "yfcc_protoclip_rn101_8ep"} == {n for n in names if n.startswith("yfcc")}
    # Fig. 6's text names m = 0.2M (best) and 1M (l.271), tau_y = 0.01 (best, l.275) beside the hardmax, and 10
    # images per prototype (best, l.277): those are the paper's values; the other grid points are project choices
    # (the figure's bars are not transcribed in the text)
    sizes = sorted(CFG.run(n).episode_size for n in names if n.startswith("f6a"))
    assert {200_000, 1_000_000} <= set(sizes)  # l.271
    assert sizes == [50_000, 100_000, 200_000, 500_000, 1_000_000]  # project choice: the grid around them
    taus = sorted(CFG.run(n).loss.tau_y for n in names if n.startswith("f6b"))
    assert 0.01 in taus and taus == [0.005, 0.01, 0.02, 0.05]  # l.275; the rest: project choice
    ipp = sorted(CFG.run(n).kmeans.images_per_prototype for n in names if n.startswith("f6c"))
    assert 10 in ipp and ipp == [5, 10, 20, 50]  # l.277; the rest: project choice
    # Fig. 6(d): RoBERTa-large and the text encoder of CLIP ViT-B/32 (Sec. IV-D4)
    assert sorted(CFG.run(n).teacher for n in names if n.startswith("f6d")) == [
        "openai/clip-vit-base-patch32", "roberta-large"]


@pytest.mark.parametrize("name", RUNS)
def test_run_matches_the_paper(name):
    run, exp = CFG.run(name), expected(name)
    where = f"run {name}"
    # ---- Table I and Sec. IV-A1, for every run
    assert run.model in ("RN50", "RN101"), where  # Table I: ResNet-50 / ResNet-101
    arch = model_config(run.model)
    d_z = run.embed_dim if run.embed_dim is not None else arch["embed_dim"]
    assert d_z == 1024, f"{where}: d_z {d_z} (Table I: 1024)"
    assert arch["vision_cfg"]["image_size"] == 224, where  # Table I: 224 x 224
    assert arch["text_cfg"]["vocab_size"] == 49408 and arch["text_cfg"]["layers"] == 12, where
    assert arch["text_cfg"]["width"] == 512 and arch["text_cfg"]["heads"] == 8, where  # Sec. IV-A1
    assert run.context_length == 76, where  # Sec. IV-A1: max sequence length 76
    assert (run.head_hidden, run.head_out) == (2048, 128), where  # Sec. IV-A1 / Table I d_h
    assert run.batch_size == 512 and run.lr == 5e-4 and run.weight_decay == 0.5, where
    assert tuple(run.betas) == (0.9, 0.999) and run.eps == 1e-8 and run.grad_clip == 1e5, where
    assert run.loss.init_temperature == 0.07 and run.loss.max_logit_scale == 100.0, where
    assert run.kmeans.iters == 20 and run.kmeans.init in ("kmeans", "random"), where
    # Sec. IV-A2's XDC-style early stop is against over-fitting, with no criterion; the comparisons are at fixed
    # epochs and the training loss cannot see over-fitting: off (paper.yaml, docs/paper-runs.md)
    assert not run.early_stop.enabled, where
    assert run.precision in MIXED, where  # Sec. IV-A2 (l.176): "automatic mixed-precision"
    # warm-up: Table I (l.209) states "Warm-up Episodes 40", at its m = 200k; fixing them as 40 x 200k = 8M samples
    # for every episode size (Fig. 6(a)'s m too) is a project choice (train/schedule.py), not a paper value
    assert run.warmup_samples == 40 * 200_000, where
    # ---- per table / figure
    assert run.data == exp["data"], where
    assert run.epochs == exp["epochs"], where
    if exp["episode_size"] != "sweep":
        assert run.episode_size == exp["episode_size"], where
    if exp["images_per_prototype"] != "sweep" and run.method == "protoclip":
        assert run.kmeans.images_per_prototype == exp["images_per_prototype"], where
        assert run.kmeans.n_clusters is None, where
        if run.episode_size == 200_000:
            assert run.episode_size // run.kmeans.images_per_prototype == 20_000, where  # Table I: K = 20k
    if exp["tau_y"] not in ("sweep", None) and run.method == "protoclip" and run.loss.soft_targets:
        assert run.loss.tau_y == exp["tau_y"], where
    if name.startswith("f6"):
        assert run.method == "protoclip", where
        if not name.startswith("f6b"):
            assert run.loss.soft_targets is False, where  # Fig. 6 default: no soft target
        assert run.lock_image_epoch is None, where
    if exp["teacher"] != "sweep":
        if run.method == "clip" or "no_roberta" in name or name.startswith(("t10_", "f6")):
            assert run.teacher is None or run.method == "clip", where
        else:
            assert run.teacher == exp["teacher"], where
    ablated_aug = name in ("t3_no_roberta_no_augmentation", "t11_simclr_augmentation", "t11_no_augmentation")
    if not ablated_aug:
        # Sec. IV-B3 (l.188): the lighter augmentation "to train ProtoCLIP"; the CLIP baselines' (method: clip) is a
        # project choice, the paper not saying how its CLIP rows were augmented: the same input pipeline for both
        assert run.augmentation == exp["augmentation"], where
    # Sec. IV-A2 (l.176): ProtoCLIP's image encoder locked "at 16 of 32 epochs"; the same half for other lengths and
    # for the CLIP baselines (t4_clip_*, f7_*, yfcc_*'s clip rows) is a project choice, not a paper value
    if exp["lock"] == "none":
        assert run.lock_image_epoch is None, where
    elif exp["lock"] is not None:
        assert run.lock_image_epoch == exp["lock"], where
    if run.epochs == 32 and run.method == "protoclip":  # the one locking schedule the paper states (l.176)
        assert run.lock_image_epoch == 16, where


def test_every_table_and_figure_is_a_target_with_its_paper_runs():
    """The report regenerates every table and figure but Table IX (detection fine-tuning, not run here); every
    row it can fill names a paper run (the CLIP rows of Tables V-VIII are OpenCLIP's released checkpoints)."""
    ids = [t.id for t in CFG.paper_targets()]
    assert ids == ["table_methods_paper", "table_III", "table_IV", "table_V", "table_VI", "table_VII", "table_VIII",
                   "table_X", "table_XI", "table_XII", "fig_6a", "fig_6b", "fig_6c", "fig_6d", "fig_7", "fig_8", "fig_9",
                   "fig_temperature", "table_pauc_in100_paper",
                   "table_temperature_2_paper"]
    for t in CFG.paper_targets():
        for row in t.rows:
            if row.run and not (t.id in ("table_V", "table_VI", "table_VII", "table_VIII") and "CLIP" == row.label.split()[-1]):
                assert CFG.run_group(row.run), f"{t.id} row {row.label!r}: no paper run {row.run}"


def test_every_paper_run_is_tagged_with_its_tables():
    """The MLflow target tags (ProjectConfig.run_targets) of paper runs, as the tables print them: Table III's
    CLIP row is also Table X's; ProtoCLIP 32 ep is in Tables IV and XII and Figs. 8-9; the YFCC runs in V-VIII."""

    assert CFG.run_targets("t3_clip") == ["table_III", "table_X"]
    assert {"table_IV", "table_XII", "fig_8", "fig_9"} <= set(CFG.run_targets("t4_protoclip_32ep"))
    assert CFG.run_targets("yfcc_protoclip_rn101_8ep") == ["table_V", "table_VI", "table_VII", "table_VIII"]
    assert CFG.run_targets("f7_clip_subset_0.25") == ["fig_7"] and "fig_7" in CFG.run_targets("t4_clip_32ep")
    assert all(CFG.run_targets(r) for r in RUNS), [r for r in RUNS if not CFG.run_targets(r)]


def test_prepare_and_warmup_are_consistent_across_episode_sizes():
    assert CFG.prepare.image_size == 224  # Table I: 224 x 224
    # Fig. 6(a) on 1M pairs: the warm-up is the same number of steps for every m, and never the whole run
    steps = set()
    for name in (n for n in RUNS if n.startswith("f6a")):
        run = CFG.run(name)
        s = Schedule.build(base_lr=run.lr, epochs=run.epochs, dataset_size=1_000_000, episode_size=run.episode_size,
                           batch_size=run.batch_size, warmup_episodes=run.warmup_episodes, lock_image_epoch=None,
                           warmup_samples=run.warmup_samples)
        assert s.warmup_steps < s.total_steps / 2, name
        steps.add(s.warmup_steps)
    assert len(steps) == 1


# ---- the related methods at their papers' settings, and every shipped config ------------------------------------
MIXED = ("auto", "bf16", "fp16")  # automatic mixed precision (auto: bf16 autocast on CUDA)
NCLIP = dict(  # nclip-xclip.txt: Table 14 (l.556-570), Sec. 3.2 (l.112 context 77; l.118 batch 4096, AMP, 3 warm-up
    # epochs, crop scale (0.5, 1.0)); the data are the project's CC 2.5M, so 3 epochs = 3 x 2.5M samples
    batch=4096, warmup_samples=3 * 2_500_000, crop=(0.5, 1.0), context=77, precision=MIXED, epochs=32,
    # l.118 / Table 14: AdamW, peak 1e-3, beta2 0.98, eps 1e-6, weight decay 0.2; l.558: "learning rate end 2e-6"
    optimizer=("adamw", dict(lr=1e-3, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.2)),
    # on CC 2.5M in episodes of 200k: 400 episodes of ceil(200k / 4096) = 49 steps; the 3 of 32 epochs of warm-up
    # (l.118) are ceil(7.5M / 4096) = 1832 steps; the cosine ends at 2e-6 (l.558)
    schedule=dict(corpus=2_500_000, total_steps=400 * 49, warmup_steps=1832, warmup_share=3 / 32,
                  lr_at=[(1831, 1e-3), (400 * 49, 2e-6)]))
# clip-temperature-multi-class-tokens.txt, the ablation recipe: Table 5's "Ablation Table 7" column (l.776 batch
# 2,048; l.780 projection 512 for one token; l.781 maximum temperature 100; l.782-788 wd 0.5, 5,000 warm-up
# iterations, peak 5e-4, betas 0.9 / 0.98, eps 1e-8, global-norm clip 1.0) and App. A's ablation paragraph (l.805-810:
# AdamW, "108,000 iterations", cosine; l.815-816 the maximum temperature unchanged for every topology); Sec. 2.3
# (l.242-247): YFCC-15M ("roughly 15.3 million" pairs), ViT-S/16 at 224 px; l.430-431 context 77.
# Project choices, not the ablation's: precision fp32 and the crop [0.8, 1.0] (the large-scale paragraph's, l.798,
# l.802), episodes of 204,800 pairs, the corpus yfcc14m (ProtoCLIP's 14M subset of YFCC-15M, paper.yaml)
TEMPERATURE = dict(
    batch=2048, steps=108_000, warmup_iterations=5000, crop=(0.8, 1.0), context=77, precision=("fp32",),
    optimizer=("adamw", dict(lr=5e-4, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.5)),
    # the budget is in steps: 108,000 at any corpus size (here the paper's 15.3M), 5,000 of them warm-up (4.6 %)
    schedule=dict(corpus=15_300_000, total_steps=108_000, warmup_steps=5000, warmup_share=5000 / 108_000,
                  lr_at=[(4999, 5e-4), (108_000, 0.0)]),
    tower=dict(model="ViT-S-16", image_size=224, width=512, max_scale=100.0, grad_clip=1.0, data=["yfcc14m"]))
PROTOCLIP = dict(  # protoclip.txt Table I (l.207 batch 512, l.209 "Warm-up Episodes 40": as 40 x 200k samples for
    # every m, a project choice), l.174 context 76, l.176 AMP
    batch=512, warmup_samples=40 * 200_000, crop=(0.5, 1.0), context=76, precision=MIXED,
    # l.176 "Adam ... with decoupled weight decay" (AdamW); Table I l.212-215: 0.9, 0.999, 1e-8, 5e-4, wd 0.5
    optimizer=("adamw", dict(lr=5e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.5)))
PCL = dict(  # pcl-protonce.txt l.150 (batch 256, 200 epochs, first 20 InfoNCE only, r = 16000, K = 25k/50k/100k;
    # PCL v2: tau 0.2, MoCo v2 augmentation with blur); no LR warm-up in the paper (PAUC l.158 neither)
    batch=256, warmup_episodes=0, aug="mocov2", queue=16000, negatives=16000, clusters=[25000, 50000, 100000],
    tau=0.2, epochs=200,
    # l.150 (PAUC l.158 the same): "SGD ... weight decay of 0.0001, a momentum of 0.9", "initial learning rate is
    # 0.03, and is multiplied by 0.1 at 120 and 160 epochs" (torch.optim.SGD, no Nesterov, as MoCo's code)
    optimizer=("sgd", dict(lr=0.03, momentum=0.9, weight_decay=1e-4, nesterov=False, dampening=0)),
    # ImageNet-1K's 1,281,167 images, one episode per epoch (m capped at M): 200 x ceil(M / 256) = 200 x 5005 steps,
    # the LR x0.1 from the first step of epochs 120 and 160
    schedule=dict(corpus=1_281_167, total_steps=200 * 5005, warmup_steps=0, warmup_share=0.0,
                  lr_at=[(0, 0.03), (120 * 5005 - 1, 0.03), (120 * 5005, 0.003), (160 * 5005 - 1, 0.003),
                         (160 * 5005, 0.0003), (200 * 5005 - 1, 0.0003)]),
    # l.150: r = 16000 with K >= 25000: all 16000 drawn at every K (ImageNet-1K's 1,281,167 training images, the
    # "ImageNet-1M" of l.150)
    drawn=16000, images=1_281_167,
    # l.150: "A ResNet-50 ... whose last fully-connected layer outputs a 128-D" feature (torchvision's, as MoCo's and
    # PCL's code build it); v2's "MLP projection layer" (l.150) as 2048 -> 2048 -> 128: MoCo v2's code, the paper
    # states no width (a project choice, not a paper value)
    head=[(2048, 2048), (2048, 128)])
# pauc-nemd.txt l.156 (PCL v1's augmentation; "the last fully connected layer outputs a 128-D embedding": v1's fc),
# l.160 (r = 16000, K)
PAUC_1K = dict(PCL, aug="mocov1", tau=0.1, head=[(2048, 128)])
# pauc-nemd.txt l.158 (ImageNet-100: K = 2500/5000/10000, r = 1024) and l.74 / l.82 (r: the negative instances,
# i.e. the queue, and the negative prototypes alike)
# l.158: r = 1024 < K: all drawn; 126,689 training images: CMC's ImageNet-100 (not stated by PAUC; any n > K fits)
IN100 = dict(queue=1024, negatives=1024, clusters=[2500, 5000, 10000], drawn=1024, images=126_689,
             # 200 x ceil(126,689 / 256) = 200 x 495 steps, the same drops
             schedule=dict(corpus=126_689, total_steps=200 * 495, warmup_steps=0, warmup_share=0.0,
                           lr_at=[(120 * 495 - 1, 0.03), (120 * 495, 0.003), (160 * 495, 0.0003)]))
RELATED = {
    "pm_nclip": NCLIP, "pm_xclip": NCLIP, "pm_clip_vitb16": NCLIP,
    "pm_clip_multi32x16": TEMPERATURE, "pm_clip_vitb16_t5": TEMPERATURE,
    "pt_sphere_init14": TEMPERATURE, "pt_sphere_init1": TEMPERATURE, "pt_sphere_fixed1": TEMPERATURE,
    "pt_multi32x16_init14": TEMPERATURE, "pt_sphere_init200": TEMPERATURE, "pt_multi32x16_init1": TEMPERATURE,
    "pm_protoclip_vitb16": PROTOCLIP,
    "pcl_in1k": PCL, "pauc_in1k": PAUC_1K, "pcl_in100": dict(PCL, **IN100), "pauc_in100": dict(PAUC_1K, **IN100),
    # PCL's instance-wise baseline (Table 3's MoCo v2, Table 7's "instance only"): PCL v2 with InfoNCE alone for all
    # 200 epochs (the queue PCL's r, not MoCo v2's 65,536: a project choice, so the prototypes are the one difference)
    "pcl_in1k_instance_only": dict(PCL, infonce_only=200),
}


def check_paper_values(cfg, name: str, exp: dict) -> None:
    """Run ``name``'s effective settings (train defaults + its overrides, protoclip.project) against ``exp``."""
    from protoclip.data.loading.transforms import CROP_SCALE

    run, where = cfg.run(name), f"run {name}"
    assert run.batch_size == exp["batch"], where
    assert not run.early_stop.enabled, where  # fixed-epoch comparisons (paper.yaml)
    if "epochs" in exp:
        assert run.epochs == exp["epochs"], where
    assert run.steps == exp.get("steps"), where  # a budget in steps only where the paper states iterations
    if "warmup_samples" in exp:
        assert run.warmup_samples == exp["warmup_samples"] and run.warmup_steps is None, where
    elif "warmup_iterations" in exp:
        assert run.warmup_steps == exp["warmup_iterations"] and run.warmup_samples is None, where
    else:
        assert run.warmup_samples is None and run.warmup_steps is None, where
        assert run.warmup_episodes == exp["warmup_episodes"], where
    if "schedule" in exp:
        check_schedule(run, exp["schedule"], where)
    if "optimizer" in exp:
        check_optimizer(run, *exp["optimizer"], where)
    if "tower" in exp:
        t = exp["tower"]
        assert (run.model, run.image_size, run.data) == (t["model"], t["image_size"], t["data"]), where
        assert run.embed_dim * max(run.class_tokens, 1) == t["width"], where  # z: 512 d in every topology
        assert run.clip_max_logit_scale() == t["max_scale"] and run.grad_clip == t["grad_clip"], where
    if "crop" in exp:
        assert CROP_SCALE[run.augmentation] == exp["crop"], where
    if "aug" in exp:
        assert run.augmentation == exp["aug"], where
    if "context" in exp:
        ctx = run.context_length if run.context_length is not None else model_config(run.model)["text_cfg"][
            "context_length"]
        assert ctx == exp["context"], where
    if "precision" in exp:
        assert run.precision in exp["precision"], where
    if "queue" in exp:
        assert run.method == "pcl", where
        assert (run.pcl.queue_size, run.pcl.negatives) == (exp["queue"], exp["negatives"]), where
        assert run.pcl.num_clusters == exp["clusters"] and run.pcl.tau == exp["tau"], where
        # PCL l.150 / PAUC l.158: the first 20 epochs InfoNCE only (the instance-only baseline: all of them)
        assert run.pcl.infonce_only_episodes == exp.get("infonce_only", 20), where
        assert run.pauc.enabled == name.startswith("pauc"), where
        check_negatives_drawn(run, exp, where)
    if "head" in exp:
        check_backbone_and_head(run, exp["head"], where)


def check_schedule(run, exp: dict, where: str) -> None:
    """The schedule in effect (train.schedule.Schedule, as the trainer builds it) on one process at the paper's
    corpus size: its length and warm-up in optimizer steps, the warm-up's share and the LR at given steps."""
    s = Schedule.from_config(run, dataset_size=exp["corpus"])
    assert (s.total_steps, s.warmup_steps) == (exp["total_steps"], exp["warmup_steps"]), where
    assert s.warmup_steps / s.total_steps == pytest.approx(exp["warmup_share"], abs=1e-3), where
    for step, lr in exp["lr_at"]:
        assert s.lr(step) == pytest.approx(lr, rel=1e-9, abs=1e-12), (where, step)


_TINY: list = []  # one small model whose parameter groups every optimizer check builds on


def check_optimizer(run, kind: str, expected: dict, where: str) -> None:
    """The optimizer the trainer builds from the run's config (train.loop.build_optimizer): its class and values,
    weight decay on the *_decay groups only."""
    import torch

    from protoclip.models import build_model
    from protoclip.train.loop import build_optimizer

    if not _TINY:
        _TINY.append(build_model("tiny-rn", head_hidden=8, head_out=8))
    opt = build_optimizer(_TINY[0], run)
    cls = {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[kind]
    assert type(opt) is cls, (where, type(opt))
    wd = expected["weight_decay"]
    assert {g["name"]: g["weight_decay"] for g in opt.param_groups} == {
        g["name"]: (wd if g["name"].endswith("_decay") and not g["name"].endswith("no_decay") else 0.0)
        for g in opt.param_groups}, where
    for key, value in expected.items():
        if key != "weight_decay":
            got = opt.defaults[key]
            assert (tuple(got) if isinstance(got, tuple) else got) == pytest.approx(value), (where, key)


def check_negatives_drawn(run, exp: dict, where: str) -> None:
    """The negative prototypes the run draws at each of its K (losses.pcl.drawn_negatives) and as the method
    resolves them on the data set's images (PCLMethod.resolved, what the run logs)."""
    from protoclip.losses.pcl import drawn_negatives
    from protoclip.train.methods.pcl import PCLMethod

    for k in run.pcl.num_clusters:
        assert drawn_negatives(run.pcl.negatives, [k]) == exp["drawn"], (where, k)
    resolved = PCLMethod(run).resolved(exp["images"])["pcl"]
    assert (resolved["num_clusters"], resolved["negatives_drawn"]) == (exp["clusters"], exp["drawn"]), where


def check_backbone_and_head(run, head: list[tuple[int, int]], where: str) -> None:
    """The model the run builds: torchvision's ResNet-50 (fc removed, [3, 4, 6, 3] blocks) and the Linear layers
    of the head that replaces its fc (no BatchNorm: MoCo's heads)."""
    import torchvision
    from torch import nn

    from protoclip.registry import method_class

    model = method_class(run.method).build_model(run)
    net = model.clip.visual
    assert type(net) is torchvision.models.ResNet and isinstance(net.fc, nn.Identity), where
    assert [len(getattr(net, f"layer{i}")) for i in range(1, 5)] == [3, 4, 6, 3], where
    assert [(m.in_features, m.out_features) for m in model.image_head if isinstance(m, nn.Linear)] == head, where
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.image_head.modules()), where
    assert model.image_size == 224 and model.text_head is None, where


def test_a_steps_budget_is_printed_in_steps():
    """The report's row label (report.paper_tables.run_label) says what the run trains: 108,000 steps for the
    temperature ablation (its epochs key is not read), epochs elsewhere."""
    from protoclip.report.paper_tables import run_label

    assert run_label(CFG, "pt_sphere_init14") == "pt_sphere_init14: clip, ViT-S-16, yfcc14m, 108000 steps, 1 seed"
    assert run_label(CFG, "pm_nclip") == "pm_nclip: nclip, ViT-B-16, cc2.5m, 32 ep, 1 seed"


def test_related_methods_are_in_the_paper_dag_at_their_papers_settings():
    related = [n for n in CFG.run_names() if n.startswith(RELATED_PREFIXES)]
    assert sorted(related) == sorted(RELATED)
    for name, exp in RELATED.items():
        check_paper_values(CFG, name, exp)
    # the crop-only kinds are what the papers name: the crop and nothing else
    assert CFG.run("pm_nclip").augmentation == "crop50" and CFG.run("pt_sphere_init1").augmentation == "crop80"


AUG_ABLATIONS = ("t3_no_roberta_no_augmentation", "t11_simclr_augmentation", "t11_no_augmentation")  # Table XI


def protoclip_expected(cfg, name: str) -> dict | None:
    """PROTOCLIP for a trained run of ProtoCLIP's tables (without the crop where the run ablates the augmentation);
    None for a released checkpoint, which is evaluated, not trained."""
    if getattr(cfg.run(name), "pretrained", None) is not None and cfg.run(name).pretrained.tag:
        return None
    no_aug = name in AUG_ABLATIONS or name.startswith("f6")  # Fig. 6: "no augmentation" (Sec. IV-D)
    return {k: v for k, v in PROTOCLIP.items() if not (k == "crop" and no_aug)}


def test_protoclip_runs_effective_settings():
    for name in RUNS:
        if (exp := protoclip_expected(CFG, name)) is not None:
            check_paper_values(CFG, name, exp)


@pytest.mark.parametrize("path", sorted((REPO / "config").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_resolves_each_runs_own_warmup(path):
    """Every shipped config loads; a run's own warm-up key wins over its file's `train:` default, in either unit;
    the paper configs' runs each match their paper's values (the tables above)."""
    import yaml

    if path.name == "claims.yaml":  # the claims ledger's list, not a project config
        return
    cfg = load_config(path)
    raw_train = (yaml.safe_load(path.read_text()) or {}).get("train") or {}
    force = cfg.train_force
    for name in cfg.run_names():
        run, own = cfg.run(name), cfg._runs[name][0]
        level = force if any(k in force for k in ("warmup_episodes", "warmup_samples", "warmup_steps")) else own
        if level.get("warmup_steps") is not None:
            assert (run.warmup_steps, run.warmup_samples) == (level["warmup_steps"], None), name
        elif level.get("warmup_samples") is not None:
            assert (run.warmup_samples, run.warmup_steps) == (level["warmup_samples"], None), name
        elif "warmup_episodes" in level:
            assert (run.warmup_episodes, run.warmup_samples, run.warmup_steps) == (level["warmup_episodes"], None,
                                                                                   None), name
        elif "warmup_samples" in raw_train:
            assert run.warmup_samples == raw_train["warmup_samples"], name
        if path.name in ("paper.yaml", "paper_pcl.yaml"):
            if name in RELATED:
                check_paper_values(cfg, name, RELATED[name])
            elif (exp := protoclip_expected(cfg, name)) is not None:
                check_paper_values(cfg, name, exp)


def test_paper_path_validates_and_refines_the_linear_probe():
    """Curves while training (a held-out slice: retrieval on about 10k of CC 2.5M's pairs) and CLIP's C search
    at 8 steps per decade; the offline default keeps 4 (its tables unchanged)."""
    assert CFG.prepare.heldout_fraction * 2_500_000 == pytest.approx(10_000)
    assert CFG.evaluate.linear.steps_per_decade == 8
    assert all(CFG.run(n).validation.every_episodes > 0 and CFG.run(n).validation.tasks == ["retrieval"]
               for n in CFG.run_names())
    assert load_config(REPO / "config" / "config.yaml").evaluate.linear.steps_per_decade == 4


def test_corpus_sizes_are_the_papers():
    """protoclip.txt l.184 "we randomly sample a 2,500,000 subset", l.186 "used 14,000,000 of them"; Fig. 6's 1M."""
    caps = {u.name: u.max_pairs for u in CFG.prepare.user_data}
    assert caps == {"cc2.5m": 2_500_000, "cc1m": 1_000_000, "yfcc14m": 14_000_000, "imagenet": None,
                    "imagenet100": None}
