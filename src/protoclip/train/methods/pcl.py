"""``method: pcl``: Prototypical Contrastive Learning [pcl-protonce.txt; methods-spec 4], image-only (captions are
loaded by the shared data set but ignored), optionally with PAUC's regularisers (``pauc.enabled``; methods-spec
3.3), on the episodic trainer: one PCL *epoch* is one *episode* (methods-spec 5 item 2), whose ``begin_episode``
is the E-step. The mapping and the one deviation (no shuffle-BN): :class:`PCLMethod`.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from protoclip.config.architectures import is_torchvision
from protoclip.train.config import TrainConfig
from protoclip.train.methods.base import EpisodeData, Method
from protoclip.registry import register

if TYPE_CHECKING:
    import torch
    from torch import nn

    from protoclip.losses.pcl import Clusterings
    from protoclip.models.momentum import FeatureQueue, ImageEncoder, MomentumEncoder
    from protoclip.train.distributed import DistInfo

log = logging.getLogger(__name__)


@dataclass
class PCLConfig:
    """The ``train.pcl`` section, registered by ``method: pcl`` (pcl-protonce.txt; methods-spec 4). Paper-scale
    values; CPU runs override them."""

    tau: float = 0.2  # InfoNCE temperature and mean phi: PCL v2 (MLP head + MoCo v2 aug; v1: 0.1) [Sec. 4.1]
    momentum: float = 0.999  # key-encoder EMA [Sec. 4.1]
    queue_size: int = 16000  # r instance negatives [Sec. 4.1] (ref-code: 16384)
    negatives: int = 16000  # r negative prototypes per clustering [Sec. 4.1]; drawn as stated where K_min > r
    # K list: `num_clusters` if given, else dataset size / each entry of `samples_per_cluster`;
    # paper K = {25k, 50k, 100k} on 1.28M ImageNet images = N / {51.2, 25.6, 12.8} [Sec. 4.1]
    num_clusters: list[int] | None = None
    samples_per_cluster: list[float] = field(default_factory=lambda: [51.2, 25.6, 12.8])
    infonce_only_episodes: int = 20  # warm-up: InfoNCE only for the first 20 epochs (= episodes) [Sec. 4.1]
    kmeans_iters: int = 20  # ref-code faiss settings (spec 4.7.3)
    kmeans_redo: int = 5
    phi_alpha: float = 10.0  # alpha of Eq. 12
    mask_duplicate_pos: bool = False  # spec 4.2 option; False = ref-code (another sample's positive is a negative)
    infonce_weight: float = 1.0  # Eq. 11: InfoNCE + ProtoNCE with weight 1 each
    protonce_weight: float = 1.0

    def validate(self) -> None:
        """Run when the config loads, for every run (the messages get the prefix ``train.pcl.``)."""
        if (self.tau <= 0 or not 0 <= self.momentum <= 1 or self.queue_size < 1 or self.negatives < 1
                or self.phi_alpha <= 0):
            raise ValueError("tau, phi_alpha must be > 0, momentum in [0, 1], queue_size and negatives >= 1")
        if (self.num_clusters is not None and (not self.num_clusters or min(self.num_clusters) < 1)) or (
                not self.samples_per_cluster or min(self.samples_per_cluster) < 1):
            raise ValueError("num_clusters and samples_per_cluster must be non-empty lists of values >= 1")
        if self.infonce_only_episodes < 0 or self.kmeans_iters < 1 or self.kmeans_redo < 1 or min(
                self.infonce_weight, self.protonce_weight) < 0:
            raise ValueError("infonce_only_episodes and the weights must be >= 0, kmeans_iters and kmeans_redo "
                             ">= 1")


def cluster_counts(cfg: TrainConfig, n: int) -> list[int]:
    """The K list: ``pcl.num_clusters`` or ``n / samples_per_cluster`` (each at least 2, at most n)."""
    ks = cfg.pcl.num_clusters or [int(round(n / f)) for f in cfg.pcl.samples_per_cluster]
    return [int(min(max(k, 2), n)) for k in ks]


@register("pcl", sections={"pcl": PCLConfig})
class PCLMethod(Method):
    """PCL on the episodic trainer (methods-spec 5 item 2): one PCL *epoch* is one *episode*; give the run an
    ``episode_size`` >= the data set (it is capped at the data set size) so the E-step clusters the whole data set.

    * Online encoder: the model's image tower + image head g^I, l2-normalised
      (:class:`protoclip.models.momentum.ImageEncoder`). The papers' encoder is ``model: tv-resnet50``
      (torchvision's ResNet-50, z = its 2048-d pooled feature) with MoCo's head in place of fc (``head_hidden: 0``:
      PCL v1's Linear(2048, 128); ``head_hidden: 2048``: PCL v2's MLP, :class:`protoclip.models.model.MoCoHead`);
      on an open_clip tower (the offline default's tiny-rn) the head is ProtoCLIP's SwAV MLP.
      Key encoder: :class:`protoclip.models.momentum.MomentumEncoder` of the same (EMA ``pcl.momentum``), held by
      the method (not the saved model) and checkpointed with the queue through :meth:`state_dict`.
    * Data: every item gives three views (:class:`~protoclip.data.loading.transforms.MultiView`): two draws of
      ``augmentation`` (use ``mocov2``) for the query and the key, and the evaluation centre crop for the E-step
      [PCL Sec. 4.1: "center-cropped images"].
    * ``begin_episode`` = E-step, from episode ``pcl.infonce_only_episodes`` on (warm-up: InfoNCE only): momentum
      features of the centre crops of every episode item (key encoder in eval mode, gathered over DDP ranks),
      k-means at every K of the K list + phi on rank 0 (:func:`protoclip.losses.pcl.build_clusterings`), broadcast.
    * ``terms``: ``infonce`` (MoCo queue) [Eq. 1], after the warm-up ``protonce`` with r negative prototypes
      [Eq. 11] (``pcl.negatives`` as stated wherever K_min > r; else K_min - 1, logged once at the start and
      recorded as the MLflow params ``resolved.pcl.*`` and the episode statistic ``pcl_negatives``:
      :func:`protoclip.losses.pcl.drawn_negatives`) and, with PAUC, ``pauc_align`` / ``pauc_unif`` /
      ``pauc_corr``; ``total`` weights them from the config.
    * ``after_step``: momentum update (equivalent to MoCo's update at the start of the next step) and enqueue of
      this step's keys (all-gathered under DDP so every rank's queue is the same).

    Deviation, documented: MoCo's shuffle-BN is not implemented (the key encoder sees the whole batch in train
    mode, as in single-GPU MoCo re-implementations; docs/paper-runs.md). The optimiser and LR schedule are the
    run's (config/experiments/paper_pcl.yaml).
    """

    image_only = True  # the text tower is never trained: evaluation reports zero-shot / retrieval as not applicable
    reads_pauc = True  # PAUC on h^I with PCL's clusterings (methods-spec 3.3)

    @classmethod
    def check_config(cls, cfg: TrainConfig) -> None:
        super().check_config(cfg)
        if cfg.lock_image_epoch is not None:
            raise ValueError("method 'pcl' trains only the image encoder: set lock_image_epoch: null")
        if cfg.decode_on == "device":  # its third view is an evaluation crop, decoded in the workers
            raise ValueError("method 'pcl' reads three views of an image: decode_on: device is for one-view methods")

    def __init__(self, cfg: TrainConfig, info: DistInfo | None = None):
        super().__init__(cfg, info)
        self._online: ImageEncoder | None = None
        self._key: MomentumEncoder | None = None
        self._queue: FeatureQueue | None = None
        self._pending: dict | None = None
        self._keys: torch.Tensor | None = None
        self._diag: dict[str, float] = {}

    # ---- model and data ----
    @classmethod
    def head_for(cls, cfg: TrainConfig) -> str:
        """MoCo's head (fc / MLP, no BatchNorm) on the papers' torchvision ResNet; else the SwAV MLP as before."""
        return "moco" if is_torchvision(cfg.model) else cls.head

    def resolved(self, episode_size: int) -> dict[str, Any]:
        """The K list and the negative prototypes drawn per clustering for an episode of ``episode_size`` items
        (the E-step clusters the episode); a cap below ``pcl.negatives`` is logged here, once per (re)start."""
        from protoclip.losses.pcl import drawn_negatives  # heavy: torch, config loads methods

        ks = cluster_counts(self.cfg, episode_size)
        r = drawn_negatives(self.cfg.pcl.negatives, ks)
        if r < self.cfg.pcl.negatives:
            log.warning("pcl: negatives %d capped at %d = K_min - 1 (K = %s on %d items): every other prototype "
                        "is a negative", self.cfg.pcl.negatives, r, ks, episode_size)
        return {"pcl": {"num_clusters": ks, "negatives_stated": self.cfg.pcl.negatives, "negatives_drawn": r}}

    @classmethod
    def train_transform(cls, cfg: TrainConfig, image_size: int) -> Callable:
        from protoclip.data.loading.transforms import (MultiView, eval_transform,
                                                       train_transform)  # heavy: torch, config loads methods

        aug = train_transform(image_size, cfg.augmentation, cfg.augment_on)
        return MultiView(aug, aug, eval_transform(image_size))  # query view, key view, centre crop (E-step)

    def _setup(self, model: nn.Module, device: torch.device) -> None:
        """Build the key encoder (a copy of the online one) and the queue once; load a resumed state."""
        from protoclip.models.momentum import (FeatureQueue, ImageEncoder,
                                               MomentumEncoder)  # heavy: torch, config loads methods

        if self._key is not None:
            return
        self._online = ImageEncoder(model)
        self._key = MomentumEncoder(self._online, self.cfg.pcl.momentum).to(device)
        self._queue = FeatureQueue(self.cfg.pcl.queue_size, self.cfg.head_out, seed=self.cfg.seed).to(device)
        if self._pending is not None:
            self._key.load_state_dict(self._pending["key_encoder"])
            self._queue.load_state_dict(self._pending["queue"])
            self._pending = None

    # ---- per step ----
    def outputs(self) -> set[str]:
        return {"h_image", "h_key"}

    def find_unused_parameters(self) -> bool:
        return True  # the text tower and the temperatures get no gradient

    def forward(self, model: nn.Module, images: Any, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        import torch  # heavy: torch, config loads methods

        if self._key is None:
            self._setup(model, images[0].device)
        query, key = images[0], images[1]
        h = model.image_head(model.encode_image(query))
        with torch.no_grad():
            k = self._key(key)
        return {"h_image": h, "h_key": k.detach()}

    def begin_episode(self, model: nn.Module, data: EpisodeData, episode: int
                      ) -> tuple[Any, dict[str, float], dict[str, float]]:
        from protoclip.losses.pcl import build_clusterings, drawn_negatives  # heavy: torch, config loads methods
        from protoclip.train.distributed import broadcast_object  # heavy: torch, config loads methods

        self._setup(model, data.device)
        if episode < self.cfg.pcl.infonce_only_episodes:
            return None, {"pcl_warmup": 1.0}, {}
        t0 = time.perf_counter()
        feats = self._extract(data, episode)
        t_extract = time.perf_counter() - t0
        t0 = time.perf_counter()
        cl = None
        if data.info.is_main:
            ks = cluster_counts(self.cfg, feats.shape[0])
            # k-means seeds: a pure function of (seed, episode) so a resumed run redraws the same ones
            cl = build_clusterings(feats, ks, self.cfg.pcl.tau, iters=self.cfg.pcl.kmeans_iters,
                                   nredo=self.cfg.pcl.kmeans_redo, seed=self.cfg.seed * 100_003 + 1000 * episode,
                                   backend=self.cfg.kmeans.backend, alpha=self.cfg.pcl.phi_alpha)
            if data.info.enabled:
                cl = cl.to("cpu")
        cl = broadcast_object(cl, data.info).to(data.device)
        stats = {"pcl_warmup": 0.0, "pcl_negatives": float(drawn_negatives(self.cfg.pcl.negatives, cl)), **cl.stats}
        return cl, stats, {"extract": t_extract, "kmeans": time.perf_counter() - t0}

    def _extract(self, data: EpisodeData, episode: int) -> torch.Tensor:
        """Key-encoder features [m, d] of the centre crops of every episode item (eval mode), episode order."""
        import torch  # heavy: torch, config loads methods
        import torch.nn.functional as F  # heavy: torch, config loads methods
        from tqdm.auto import tqdm  # heavy: tqdm, config loads methods

        from protoclip.data.loading.transforms import normalize_batch  # heavy: torch, config loads methods
        from protoclip.train.distributed import all_gather_cat, sync_buffers  # heavy: torch, config loads methods

        sync_buffers(self._key, data.info)
        was = self._key.training
        self._key.eval()
        feats, poss = [], []
        try:
            with torch.no_grad():  # the key encoder is frozen: these features and their gather need no graph
                for batch in tqdm(data.loader, desc=f"pcl E-step {episode}", leave=False,
                                  disable=not data.info.is_main):
                    with data.autocast():
                        x = normalize_batch(batch.views[2].to(data.device, non_blocking=True))  # float: unchanged
                        feats.append(self._key(x).float())
                    poss.append(batch.positions.to(data.device, non_blocking=True))
        finally:
            self._key.train(was)
        f, pos = all_gather_cat(torch.cat(feats), data.info), all_gather_cat(torch.cat(poss), data.info)
        out = torch.empty((len(data.indices), f.shape[1]), dtype=torch.float32, device=f.device)
        out[pos] = f  # DDP padding duplicates write the same row twice
        return F.normalize(out, dim=1)

    def terms(self, model: nn.Module, out: dict[str, torch.Tensor], positions: torch.Tensor,
              state: Clusterings | None) -> dict[str, torch.Tensor]:
        import torch.nn.functional as F  # heavy: torch, config loads methods

        from protoclip.losses.pauc import pauc_loss  # heavy: torch, config loads methods
        from protoclip.losses.pcl import drawn_negatives, infonce, protonce  # heavy: torch, config loads methods

        q = F.normalize(out["h_image"].float(), dim=1)
        k = out["h_key"].float()
        self._keys = k
        terms = infonce(q, k, self._queue.keys(), self.cfg.pcl.tau)
        self._diag = {}
        if state is not None:
            pn = protonce(q, positions, state, drawn_negatives(self.cfg.pcl.negatives, state), None,
                          self.cfg.pcl.mask_duplicate_pos)
            terms["protonce"] = pn["protonce"]
            self._diag["protonce_acc"] = pn["protonce_acc"]  # on the device (read at the log interval)
            if self.cfg.pauc.enabled:
                a = self.cfg.pauc
                terms.update(pauc_loss(q, positions, state, s=a.s, t=a.t, tau_c=a.tau_c, align_mode=a.align_mode,
                                       v2=k if a.align_mode == "two_view" else None, unif_log=a.unif_log))
        return terms

    def weights(self) -> dict[str, float]:
        p, a = self.cfg.pcl, self.cfg.pauc
        return {"infonce": p.infonce_weight, "protonce": p.protonce_weight, "pauc_align": a.alpha,
                "pauc_unif": a.beta, "pauc_corr": a.gamma}

    def total(self, terms: dict[str, torch.Tensor]) -> torch.Tensor:
        w = self.weights()
        return sum(w[name] * value for name, value in terms.items() if name in w)

    def diagnostics(self) -> dict[str, torch.Tensor]:
        return dict(self._diag)

    def after_step(self, model: nn.Module) -> None:
        from protoclip.train.distributed import all_gather_cat  # heavy: torch, config loads methods

        self._key.update(self._online)
        if self._keys is not None:
            self._queue.enqueue(all_gather_cat(self._keys.detach(), self.info))
            self._keys = None

    # ---- checkpointed state: key encoder + queue ----
    def state_dict(self) -> dict[str, Any]:
        if self._key is None:
            return dict(self._pending or {})
        return {"key_encoder": self._key.state_dict(), "queue": self._queue.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        if set(state) != {"key_encoder", "queue"}:
            raise ValueError(f"method 'pcl': unexpected state keys {sorted(state)}")
        if self._key is None:
            self._pending = state
        else:
            self._key.load_state_dict(state["key_encoder"])
            self._queue.load_state_dict(state["queue"])
