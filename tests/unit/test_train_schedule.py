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
