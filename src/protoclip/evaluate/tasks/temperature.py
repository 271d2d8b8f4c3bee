"""The temperature study's diagnostics (the temperature paper's Fig. 1, Fig. 8 and Table 11;
:mod:`protoclip.evaluate.metrics.temperature`): on caption pairs (the first caption per image), the equilibrium
sweep of the logit scale and the distance histograms; on a multi-token run's zero-shot set, zero-shot accuracy
of token subsets. Only for a similarity that is a distance. Settings: ``evaluate.temperature``."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from protoclip.evaluate.tasks.base import SetInput, TaskResult, zeroshot_classifier
from protoclip.jobs.devices import resolve_device
from protoclip.tasks import Task, register


@dataclass
class TemperatureConfig:
    """``evaluate.temperature``: the temperature paper's Fig. 1 / Fig. 8 / Table 11 diagnostics
    (protoclip.evaluate.metrics.temperature). Defaults: the offline size (held-out pairs, ~460)."""
    # Fig. 1 "mini-batch of samples in varying sizes" (sizes not given); larger than the pairs: skipped
    # (16 also gives CI's ~24 held-out fixture pairs a curve)
    batch_sizes: list[int] = field(default_factory=lambda: [16, 64, 256])
    # Fig. 1 "Shuffle = P%" as fractions (spec 2.5: P in {0, 1, 5, ...})
    shuffle_shares: list[float] = field(default_factory=lambda: [0.0, 0.01, 0.05, 0.1, 0.2])
    scale_min: float = 0.1  # the sweep of the logit scale tau: log-spaced, covering Multi's ~4 and CLIP's 100
    scale_max: float = 1000.0
    scale_steps: int = 41
    histogram_bins: int = 50  # Fig. 8
    histogram_max_points: int = 2000  # Fig. 8 on a seeded subset of at most this many pairs (n^2 negatives)
    token_subsets: list[int] = field(default_factory=lambda: [1, 2, 4, 8])  # Table 11: k of m tokens (k < m used)
    token_draws: int = 10  # random k-subsets per k (every subset when there are at most this many; paper: not given)

    def validate(self) -> None:
        if not 0 < self.scale_min < self.scale_max or self.scale_steps < 2:
            raise ValueError("temperature.scale_min must be > 0 and < scale_max, scale_steps >= 2")
        if any(b < 2 for b in self.batch_sizes) or any(not 0 <= p <= 1 for p in self.shuffle_shares):
            raise ValueError("temperature.batch_sizes must be >= 2 and shuffle_shares in [0, 1]")
        if self.histogram_bins < 1 or self.histogram_max_points < 2 or self.token_draws < 1:
            raise ValueError("temperature.histogram_bins, token_draws must be >= 1 and histogram_max_points >= 2")

    def scales(self) -> list[float]:
        import numpy as np  # heavy: numpy, config loads tasks

        return np.geomspace(self.scale_min, self.scale_max, self.scale_steps).tolist()


def task_temperature(x: SetInput) -> TaskResult:
    """Only for a similarity that is a distance (:func:`too_small`)."""
    import numpy as np  # heavy: numpy, config loads tasks

    from protoclip.evaluate.metrics import temperature as tm  # heavy: torch, config loads tasks

    f, cfg, sim = x.feats, x.cfg, x.similarity
    t: TemperatureConfig = cfg.temperature
    m: dict[str, Any] = {}
    sizes: dict[str, int] = {}
    what = []
    if f.captions:
        # one positive pair per image: its first caption; the run's similarity as a dot product
        t2i = np.asarray(f.caption_text_to_image)
        images, first_text = np.unique(t2i, return_index=True)
        if not sim.dot_product:
            img = f.caption_image_z / np.linalg.norm(f.caption_image_z, axis=1, keepdims=True)
            txt = f.caption_text_z / np.linalg.norm(f.caption_text_z, axis=1, keepdims=True)
        else:
            img, txt = f.caption_image_s, f.caption_text_s
        img, txt = img[images], txt[first_text]
        m.update(tm.equilibrium_sweep(img, txt, t.scales(), t.batch_sizes, t.shuffle_shares, seed=cfg.seed,
                                      device=resolve_device(cfg.device)))
        m["histograms"] = tm.distance_histograms(img, txt, t.histogram_bins, t.histogram_max_points, seed=cfg.seed)
        sizes["n_pairs"] = int(len(images))
        what.append(f"caption pairs (first caption per image), {sim.name} similarity")
    if sim.tokens > 1 and f.test_s is not None:
        m["tokens"] = sim.tokens
        m["token_subsets"] = tm.token_subset_zeroshot(f.test_s, zeroshot_classifier(x), f.test_y, sim.tokens,
                                                      t.token_subsets, t.token_draws, seed=cfg.seed)
        sizes["n_test"] = int(len(f.test_y))
        what.append(f"token subsets of the {sim.tokens} tokens (zero-shot, prompt-averaged)")
    return TaskResult(m, "; ".join(what), sizes)


def too_small(feats, similarity) -> str | None:
    if not similarity.distance:  # e.g. nCLIP's -CE: Eq. 1 / Fig. 8 do not apply
        return f"the {similarity.name} similarity is not a distance"
    if not feats.captions and not (similarity.tokens > 1 and feats.test_s is not None):
        return "no caption pairs, and a single-token run has no token subsets"
    return None


# the temperature study: tau* at ratio 1 (Fig. 1), the pairs (Fig. 1 / 8), the tokens (Table 11); caption pairs
# and / or a zero-shot set's token subsets
TASK = register(Task("temperature", ("equilibrium_scale", "n_pairs", "tokens"), task_temperature, templates=True,
                     captions=True, any_input=True, text=True, order=80, settings=TemperatureConfig,
                     too_small=too_small))

__all__ = ["TASK", "TemperatureConfig", "task_temperature"]
