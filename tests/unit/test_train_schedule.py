"""Episode / LR schedule of the trainer: known values and open_clip's cosine_lr as the oracle."""
from __future__ import annotations

import math

import pytest
import torch

from protoclip.train.schedule import (
    Schedule,
    epoch_at_step,
    image_lr_factor,
    n_episodes,
    steps_per_episode,
    warmup_cosine_lr,
)


def test_n_episodes_paper_values():
    # Sec. III-D: n_episode = n_epoch * M / m. CC2.5M, 32 epochs, m = 200k -> 400 episodes.
    assert n_episodes(32, 2_500_000, 200_000) == 400
    # CC1M ablation, 20 epochs, m = 0.2M -> 100 episodes.
    assert n_episodes(20, 1_000_000, 200_000) == 100
    # rounding up when not divisible: 1 epoch of 10 items in episodes of 3 -> 4 episodes
    assert n_episodes(1, 10, 3) == 4
    # no float fuzz: 4 * 1000 / 1000 is exactly 4 episodes
    assert n_episodes(4.0, 1000, 1000) == 4


def test_steps_per_episode():
    assert steps_per_episode(200_000, 512) == 391  # ceil(390.625)
    assert steps_per_episode(32, 16) == 2
    assert steps_per_episode(33, 16) == 3  # short last batch kept
    # 2 ranks: each takes ceil(33/2) = 17 items -> 2 batches of <=16
    assert steps_per_episode(33, 16, world_size=2) == 2


@pytest.mark.parametrize("bad", [(0, 512), (10, 0)])
def test_steps_per_episode_rejects_bad_input(bad):
    with pytest.raises(ValueError):
        steps_per_episode(*bad)


def test_warmup_cosine_matches_open_clip_cosine_lr():
    from open_clip_train.scheduler import cosine_lr  # the OpenCLIP codebase ProtoCLIP builds on

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
    base, warm, total = 5e-4, 7, 40
    oracle = cosine_lr(opt, base, warm, total)
    for step in range(total):
        assert warmup_cosine_lr(step, base, warm, total) == pytest.approx(oracle(step), rel=1e-12)


def test_warmup_cosine_known_values():
    base = 1.0
    assert warmup_cosine_lr(0, base, 4, 14) == pytest.approx(0.25)
    assert warmup_cosine_lr(3, base, 4, 14) == pytest.approx(1.0)
    assert warmup_cosine_lr(4, base, 4, 14) == pytest.approx(1.0)  # cosine starts at the peak
    assert warmup_cosine_lr(9, base, 4, 14) == pytest.approx(0.5)  # half-way through decay
    assert warmup_cosine_lr(14, base, 4, 14) == pytest.approx(0.0, abs=1e-12)
    assert warmup_cosine_lr(3, base, 4, 4) == pytest.approx(1.0)  # warm-up only


def test_locked_image_epoch():
    # M = 100, batch 10: step 50 is epoch 5.0
    assert epoch_at_step(50, 10, 100) == pytest.approx(5.0)
    assert image_lr_factor(49, 10, 100, 5.0) == 1.0
    assert image_lr_factor(50, 10, 100, 5.0) == 0.0
    assert image_lr_factor(10_000, 10, 100, None) == 1.0
    assert epoch_at_step(25, 10, 100, world_size=2) == pytest.approx(5.0)


def test_schedule_paper_defaults():
    s = Schedule.build(base_lr=5e-4, epochs=32, dataset_size=2_500_000, episode_size=200_000, batch_size=512,
                       warmup_episodes=40, lock_image_epoch=16.0)
    assert s.n_episodes == 400 and s.steps_per_episode == 391
    assert s.warmup_steps == 40 * 391 and s.total_steps == 400 * 391
    assert s.lr(0) == pytest.approx(5e-4 / (40 * 391))
    lock_step = math.ceil(16 * 2_500_000 / 512)  # first step at or after epoch 16
    assert s.image_lr(lock_step - 1) > 0 and s.image_lr(lock_step) == 0.0
    assert s.lr(lock_step) > 0  # only the image groups are locked


def test_warmup_in_samples_does_not_depend_on_episode_size():
    # Fig. 6(a): 1M pairs, 20 epochs, batch 512. Counted in episodes, 40 warm-up episodes at m = 500k are the
    # whole run (40 episodes) and the LR never decays; counted in samples (40 x 200k) they are 8M samples
    kw = dict(base_lr=5e-4, epochs=20, dataset_size=1_000_000, batch_size=512,
              lock_image_epoch=None, warmup_episodes=40)
    by_episodes = Schedule.build(episode_size=500_000, **kw)
    assert by_episodes.warmup_steps >= by_episodes.total_steps  # the bug the rule fixes
    steps = set()
    for m in (50_000, 100_000, 200_000, 500_000, 1_000_000):
        s = Schedule.build(episode_size=m, warmup_samples=8_000_000, **kw)
        steps.add(s.warmup_steps)
        assert s.warmup_steps == math.ceil(8_000_000 / 512) < s.total_steps
        assert s.lr(s.total_steps - 1) < 0.01 * 5e-4  # the cosine decays to ~0 at the end
    assert len(steps) == 1
    # at m = 200k the rule is Table I's 40 episodes up to rounding of the last batch of each episode
    t1 = Schedule.build(episode_size=200_000, **kw).warmup_steps
    assert abs(t1 - math.ceil(8_000_000 / 512)) <= 40
    # DDP: samples are global, so the steps shrink with the world size
    assert Schedule.build(episode_size=200_000, warmup_samples=8_000_000, world_size=4,
                          **kw).warmup_steps == math.ceil(8_000_000 / 2048)


def test_early_stop_rule_known_answers():
    from protoclip.train.schedule import early_stop_update

    state = None
    seen = []
    for v in [3.0, 2.5, 2.6, 2.5, float("nan"), 2.4, 2.45, 2.41, 2.40]:
        state = early_stop_update(state, v, patience=3, min_delta=0.0)
        seen.append((state["best"], state["bad"], state["stopped"]))
    assert seen == [(3.0, 0, False), (2.5, 0, False), (2.5, 1, False), (2.5, 2, False),  # equal is no gain
                    (2.5, 2, False),  # NaN: neither improves nor counts
                    (2.4, 0, False), (2.4, 1, False), (2.4, 2, False), (2.4, 3, True)]
    assert early_stop_update(state, 0.1, patience=3)["stopped"]  # once stopped, stays stopped
    # min_delta: an improvement must beat the best by more than min_delta
    s = early_stop_update(None, 1.0, patience=1, min_delta=0.1)
    assert early_stop_update(s, 0.95, patience=1, min_delta=0.1)["stopped"]
    assert not early_stop_update(s, 0.85, patience=1, min_delta=0.1)["stopped"]
    with pytest.raises(ValueError, match="patience"):
        early_stop_update(None, 1.0, patience=0)


def test_per_rank_batch_splits_the_global_batch_exactly():
    from protoclip.train.schedule import per_rank_batch

    assert [per_rank_batch(512, k) for k in (1, 2, 4, 8)] == [512, 256, 128, 64]
    with pytest.raises(ValueError, match="batch_size 512 .* not a multiple of the 3 ranks"):
        per_rank_batch(512, 3)
    # Table I's run on 1 or 8 GPUs: the same steps, warm-up and epochs per step (B = 512 either way)
    one, eight = (Schedule.build(base_lr=5e-4, epochs=32, dataset_size=2_500_000, episode_size=200_000,
                                 batch_size=per_rank_batch(512, k), warmup_episodes=40, lock_image_epoch=16.0,
                                 world_size=k, warmup_samples=8_000_000) for k in (1, 8))
    assert (one.total_steps, one.warmup_steps) == (eight.total_steps, eight.warmup_steps) == (400 * 391, 15625)
    assert [one.lr(s) for s in (0, 20000, 100000)] == [eight.lr(s) for s in (0, 20000, 100000)]
    assert one.epoch(78125) == eight.epoch(78125) == 16.0 and one.image_lr(78125) == eight.image_lr(78125) == 0.0


# ---- min_lr, step decay, budgets in optimizer steps ------------------------------------------------------------
def test_cosine_decays_to_min_lr():
    # nCLIP Table 14 (nclip-xclip.txt l.557-558): peak 1e-3, "learning rate end 2e-6"
    base, end = 1e-3, 2e-6
    assert warmup_cosine_lr(3, base, 4, 14, min_lr=end) == pytest.approx(base)  # warm-up unchanged
    assert warmup_cosine_lr(4, base, 4, 14, min_lr=end) == pytest.approx(base)  # the cosine starts at the peak
    assert warmup_cosine_lr(9, base, 4, 14, min_lr=end) == pytest.approx((base + end) / 2)  # half-way
    assert warmup_cosine_lr(14, base, 4, 14, min_lr=end) == pytest.approx(end, rel=1e-12)
    # 0 is open_clip's schedule: the known values above


def test_step_decay_known_values():
    from protoclip.train.schedule import step_decay_lr

    # PCL (pcl-protonce.txt l.150): 0.03, x0.1 at epochs 120 and 160; 7 steps per epoch, no warm-up
    lr = [step_decay_lr(s, 0.03, 0, (120, 160), 0.1, 7.0) for s in range(200 * 7)]
    assert lr[0] == lr[120 * 7 - 1] == 0.03
    assert lr[120 * 7] == pytest.approx(0.003) and lr[160 * 7 - 1] == pytest.approx(0.003)
    assert lr[160 * 7] == pytest.approx(0.0003) and lr[-1] == pytest.approx(0.0003)
    # a warm-up of 4 steps before it, the open_clip ramp
    assert step_decay_lr(0, 1.0, 4, (1,), 0.5, 10.0) == 0.25 and step_decay_lr(4, 1.0, 4, (1,), 0.5, 10.0) == 1.0
    assert step_decay_lr(10, 1.0, 4, (1,), 0.5, 10.0) == 0.5


def test_step_schedule_milestones_fall_on_episode_starts():
    # one episode per epoch (m capped at M = 1000, batch 64: 16 steps, the last batch short): the drop is at the
    # first step of episode 3, not 3 x 1000 / 64 = 46.9 steps in (which counting samples would give)
    s = Schedule.build(base_lr=0.03, epochs=5, dataset_size=1000, episode_size=1000, batch_size=64,
                       warmup_episodes=0, lock_image_epoch=None, lr_schedule="step", milestones=(3, 4), gamma=0.1)
    assert (s.steps_per_episode, s.steps_per_epoch, s.total_steps) == (16, 16.0, 80)
    assert s.lr(47) == 0.03 and s.lr(3 * 16) == pytest.approx(0.003) and s.lr(4 * 16) == pytest.approx(0.0003)
    # m = M / 2: an epoch is two episodes
    h = Schedule.build(base_lr=1.0, epochs=4, dataset_size=1000, episode_size=500, batch_size=100,
                       warmup_episodes=0, lock_image_epoch=None, lr_schedule="step", milestones=(2,), gamma=0.5)
    assert h.steps_per_epoch == 10.0 and h.lr(19) == 1.0 and h.lr(20) == 0.5


def test_steps_budget_draws_enough_episodes_and_ends_at_the_budget():
    from protoclip.train.schedule import budget_episodes

    assert budget_episodes(10, 5) == 2 and budget_episodes(11, 5) == 3 and budget_episodes(1, 98) == 1
    with pytest.raises(ValueError):
        budget_episodes(0, 5)
    # the temperature paper's ablation (l.806-810): 108,000 iterations at batch 2,048, 5,000 warm-up iterations,
    # on 14M pairs in episodes of 204,800 (100 full batches): 1,080 episodes, the cosine over exactly 108,000 steps
    s = Schedule.build(base_lr=5e-4, epochs=32, dataset_size=14_000_000, episode_size=204_800, batch_size=2048,
                       warmup_episodes=40, lock_image_epoch=None, warmup_samples=8_000_000, steps=108_000,
                       warmup_iterations=5000)
    assert (s.n_episodes, s.steps_per_episode, s.total_steps, s.warmup_steps) == (1080, 100, 108_000, 5000)
    assert s.lr(4999) == pytest.approx(5e-4) and s.lr(107_999) < 1e-9
    # a budget that is not a whole number of episodes: the last episode is drawn and cut
    c = Schedule.build(base_lr=1.0, epochs=1, dataset_size=100, episode_size=50, batch_size=10, warmup_episodes=0,
                       lock_image_epoch=None, steps=23)
    assert (c.n_episodes, c.total_steps) == (5, 23)
    assert c.lr(23 // 2) == pytest.approx(0.5 * (1 + math.cos(math.pi * 11 / 23)))


def test_warmup_steps_win_over_samples_and_episodes():
    from protoclip.train.schedule import warmup_steps

    assert warmup_steps(40, 391, 8_000_000, 512, warmup_iterations=5000) == 5000
    assert warmup_steps(40, 391, 8_000_000, 512) == 15625 and warmup_steps(40, 391, None, 512) == 40 * 391
    with pytest.raises(ValueError, match="warmup_steps"):
        warmup_steps(40, 391, None, 512, warmup_iterations=-1)


def test_schedule_from_config_reads_every_key():
    from protoclip.train.config import TrainConfig

    cfg = TrainConfig(epochs=200, episode_size=2_000_000, batch_size=256, warmup_episodes=0, lr=0.03,
                      lr_schedule="step", lr_milestones=[120, 160], optimizer="sgd", lock_image_epoch=None)
    s = Schedule.from_config(cfg, dataset_size=1_281_167)
    assert (s.episode_size, s.n_episodes, s.steps_per_episode, s.warmup_steps) == (1_281_167, 200, 5005, 0)
    assert s.lr(120 * 5005 - 1) == 0.03 and s.lr(120 * 5005) == pytest.approx(0.003)
    assert s.lr(160 * 5005) == pytest.approx(0.0003)
    two = Schedule.from_config(cfg, dataset_size=1_281_167, world_size=2)
    assert two.batch_size == 128 and two.steps_per_episode == 5005
    n = TrainConfig(lr=1e-3, min_lr=2e-6, steps=50, warmup_steps=5, episode_size=100, batch_size=10)
    t = Schedule.from_config(n, dataset_size=1000)
    assert (t.total_steps, t.warmup_steps, t.n_episodes) == (50, 5, 5)
    # open_clip's cosine reaches its end at step == total: the last step (49) is 1 / 45 of the decay short of it
    assert t.lr(50) == pytest.approx(2e-6) and t.lr(49) == pytest.approx(2e-6 + 0.5 * (1 + math.cos(
        math.pi * 44 / 45)) * (1e-3 - 2e-6))
