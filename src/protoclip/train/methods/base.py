"""A training method: what the model is, what a batch holds, which losses it trains, how it is evaluated. A method
is one module of this package holding one :class:`Method` subclass registered with ``@register("name")`` (the
recipe: docs/architecture.md, "Adding a method: one file"). The config loader imports every method module, so a
method module imports at its top only what is light (this module, the registry, its config dataclasses) and
imports torch, open_clip and the project modules built on them inside the hooks that use them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ContextManager

from protoclip.config.architectures import is_torchvision
from protoclip.registry import METHODS, method_class, register
from protoclip.similarity import Similarity
from protoclip.train.config import TrainConfig

if TYPE_CHECKING:  # annotations only (torch inside the hooks: the module docstring)
    import numpy as np
    import torch
    from torch.utils.data import Dataset

    from protoclip.train.loader import Pass

    from protoclip.train.distributed import DistInfo


def build_method(cfg: TrainConfig, info: DistInfo | None = None) -> "Method":
    """The trainer's method object for ``cfg.method`` (``info``: the DDP world, None = single process)."""
    return method_class(cfg.method)(cfg, info)


@dataclass
class EpisodeData:
    """What ``begin_episode`` may use: the episode's items and how to run the model over them."""

    dataset: Dataset  # the whole training set (items as the method's train_transform makes them)
    indices: np.ndarray  # the episode's dataset indices, training order
    # this rank's batches of the episode's extraction pass (protoclip.data.loading.batch.Batch) in episode order,
    # from the run's one DataLoader (protoclip.train.loader; batches of train.extract_batch_size)
    loader: Pass
    info: DistInfo
    device: torch.device
    autocast: Callable[[], ContextManager]
    teacher: np.ndarray | None  # external-teacher features aligned with ``dataset`` (None: not used)
    use_teacher: bool


class Method:
    """Base class: defaults for a single-view image-text method whose model is a ProtoCLIPModel.

    The class owns everything about the method that the rest of the project asks for:

    * config: its own config sections (``@register("name", sections={"key": SectionDataclass})``, read as
      ``cfg.key``), :meth:`check_config` (its cross-field rules, run when the config loads; ``TrainConfig.method``
      is checked against the registry), :meth:`reads_teacher` (whether a run reads the external teacher);
    * model: ``head`` (the architecture of the second head, :data:`protoclip.models.model.HEADS`),
      :meth:`build_model`, :meth:`train_transform`;
    * training: the per-step and per-episode hooks below;
    * evaluation: :meth:`eval_spec` (similarity, sub-spheres, image-only), written into ``model.pt`` at save time
      so that evaluation reads it from the model file (:func:`protoclip.models.checkpoint.read_eval_spec`), and
      :meth:`similarity_class`: how evaluation scores an image against a text (a
      :class:`protoclip.similarity.Similarity` subclass defined in the method's module).

    The loop (:mod:`protoclip.train.loop`) is the same for every method: sample an episode -> ``begin_episode`` ->
    for each batch ``forward`` -> ``terms`` -> ``total`` -> backward/step -> ``after_step`` -> checkpoint::

        from protoclip.train.methods.base import Method, register

        @register("mymethod")
        class MyMethod(Method):
            def outputs(self): return {"z_image", "z_text", "logit_scale"}
            def terms(self, model, out, positions, state): return {"my": ...}
            def total(self, terms): return terms["my"]

    Everything else has a default (CLIP-like: one view + tokens, no episode work, no state, cosine similarity).
    """

    head = "swav"  # the model's second head: "swav" (ProtoCLIP g) or "nclip" (protoclip.models.model.HEADS)
    similarity = Similarity  # how evaluation scores an image against a text (protoclip.similarity)
    image_only = False  # trains the image tower only: evaluation reports zero-shot / retrieval as not applicable
    reads_pauc = False  # reads the ``pauc`` section (PAUC's regularisers need the method's prototypes)

    name = "?"  # set by @register
    sections: dict[str, type] = {}  # the config sections registered with the method (@register(..., sections=))

    def __init__(self, cfg: TrainConfig, info: DistInfo | None = None):
        from protoclip.train.distributed import DistInfo  # heavy: torch, config loads methods

        self.cfg = cfg
        self.info = info if info is not None else DistInfo()

    # ---- config (called by TrainConfig when the config loads: no torch here) ----
    @classmethod
    def check_config(cls, cfg: TrainConfig) -> None:
        """Raise ValueError (one line naming the key) when ``cfg`` asks something of this method it cannot do.
        The section values themselves are checked by ``TrainConfig.validate``."""
        if cfg.pauc.enabled and not cls.reads_pauc:
            users = " or ".join(repr(n) for n, c in sorted(METHODS.items()) if c.reads_pauc)
            raise ValueError(f"pauc.enabled needs prototypes: method {users}")
        if is_torchvision(cfg.model) and not cls.image_only:
            raise ValueError(f"model '{cfg.model}' is an image-only torchvision backbone: method {cls.name!r} trains "
                             "a text tower too; use an open_clip model (e.g. RN50)")

    @classmethod
    def reads_teacher(cls, cfg: TrainConfig) -> bool:
        """Whether a run of this method reads the external-teacher cache ``cfg.teacher``."""
        return False

    # ---- evaluation (written into model.pt at save time; protoclip.models.checkpoint.read_eval_spec) ----
    @classmethod
    def similarity_for(cls, cfg: TrainConfig) -> type[Similarity]:
        """The evaluation similarity of a model trained with ``cfg`` (see ``similarity`` above)."""
        return cls.similarity

    @classmethod
    def similarity_class(cls, name: str) -> type[Similarity]:
        """The similarity a model file of this method names (``EvalSpec.similarity``)."""
        if name == Similarity.name:
            return Similarity
        if cls.similarity.name == name:
            return cls.similarity
        raise ValueError(f"method {cls.name!r} has no evaluation similarity {name!r}")

    @classmethod
    def eval_spec(cls, cfg: TrainConfig) -> dict[str, Any]:
        """How evaluation uses a model trained with ``cfg``: the keys of ``protoclip.models.checkpoint.EvalSpec``."""
        return {"method": cls.name, "similarity": cls.similarity_for(cfg).name, "subspheres": cfg.subspheres(),
                "image_only": bool(cls.image_only)}

    # ---- model and data (called by the train stage before training) ----
    @classmethod
    def head_for(cls, cfg: TrainConfig) -> str:
        """The second head a run of ``cfg`` builds (``protoclip.models.model.HEADS``): ``head`` unless overridden."""
        return cls.head

    @classmethod
    def build_model(cls, cfg: TrainConfig) -> torch.nn.Module:
        """A randomly initialised model for ``cfg`` (it must have ``param_groups``, ``image_size``)."""
        from protoclip.models import build_model  # heavy: torch, config loads methods

        model = build_model(cfg.model, head_hidden=cfg.head_hidden, head_out=cfg.head_out,
                            init_temperature=cfg.loss.init_temperature, head=cls.head_for(cfg),
                            class_tokens=cfg.class_tokens, embed_dim=cfg.embed_dim,
                            context_length=cfg.context_length, image_size=cfg.image_size)
        if not cfg.loss.learn_temperature:  # temperature study: the CLIP scale fixed at its init
            model.logit_scale.requires_grad_(False)
        return model

    @classmethod
    def train_transform(cls, cfg: TrainConfig, image_size: int) -> Callable:
        """PIL image -> an item's image. A method that needs several views per item returns a
        :class:`protoclip.data.loading.transforms.MultiView` here; the loader stacks its views by that form
        (:class:`protoclip.data.loading.batch.Batch`: ``views``, and ``images`` a list of [B, 3, H, W] tensors
        for :meth:`forward`). The loop moves each to the device and normalises the uint8 ones there
        (:func:`protoclip.data.loading.transforms.normalize_batch`; float views pass unchanged), so :meth:`forward`
        gets float images. With ``augment_on: device`` the uint8 views are crops and flips only:
        the loader applies the rest on the device (:mod:`protoclip.data.loading.device_augment`)."""
        from protoclip.data.loading.transforms import train_transform  # heavy: torch, config loads methods

        return train_transform(image_size, cfg.augmentation, cfg.augment_on, cfg.decode_on)

    # ---- per step ----
    def outputs(self) -> set[str]:
        """Keys of the forward output the loss reads (the DDP forward returns exactly these)."""
        raise NotImplementedError

    def find_unused_parameters(self) -> bool:
        """True when some trainable parameters get no gradient (DDP then searches the graph, slower)."""
        return True

    def forward(self, model: torch.nn.Module, images: Any, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        """The training forward (runs inside DDP's wrapper): the model's outputs plus every ``*logit_scale``
        the loss reads, exponentiated (parameters used by the loss must be touched inside forward)."""
        out = dict(model(images, tokens))
        for key in self.outputs():
            if key.endswith("logit_scale") and key not in out:
                out[key] = getattr(model, key).exp()
        return out

    def begin_episode(self, model: torch.nn.Module, data: EpisodeData, episode: int
                      ) -> tuple[Any, dict[str, float], dict[str, float]]:
        """Work before an episode's batches -> (episode state passed to ``terms``, stats logged in the episode
        record, times in seconds logged as ``time/<key>``). The state is also saved in the checkpoint
        (key ``prototypes``) for inspection; it is rebuilt at the next episode, never read on resume."""
        return None, {}, {}

    def terms(self, model: torch.nn.Module, out: dict[str, torch.Tensor], positions: torch.Tensor,
              state: Any) -> dict[str, torch.Tensor]:
        """Named unweighted scalar loss terms of one batch (``positions``: the items' episode positions)."""
        raise NotImplementedError

    def total(self, terms: dict[str, torch.Tensor]) -> torch.Tensor:
        """The optimised loss from the terms (weights from the config)."""
        raise NotImplementedError

    def diagnostics(self) -> dict[str, torch.Tensor | float]:
        """Detached 0-d tensors of the last batch (left on the device: the trainer reads them back once per log
        interval; a float() here would wait for the device every step), logged per step and averaged per episode."""
        return {}

    def after_step(self, model: torch.nn.Module) -> None:
        """After every optimizer step (temperature clamps, momentum updates, queues)."""

    def resolved(self, episode_size: int) -> dict[str, Any]:
        """Values the method derives from the data (e.g. PCL's K list and negatives drawn), for an episode of
        ``episode_size`` items: written in the log's ``start`` record and logged as MLflow params at every start."""
        return {}

    # ---- persistent method state (saved with every checkpoint, restored on resume) ----
    def state_dict(self) -> dict[str, Any]:
        """State that lives outside the model and the optimizer (e.g. a feature queue)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError(f"method {self.name!r} has no state to load, got keys {sorted(state)}")


__all__ = ["METHODS", "EpisodeData", "Method", "build_method", "method_class", "register"]
