"""How a trained model scores an image against a text at evaluation: the cosine of z, or a method's own.

A training method names its similarity in the model file (``EvalSpec.similarity``) and owns its class: the base
:class:`Similarity` (cosine) lives here, the others in their method's module, found through the method registry
(:func:`similarity_of`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from protoclip.registry import method_class

if TYPE_CHECKING:
    import numpy as np
    import torch


class Similarity:
    """The cosine of z (CLIP, ProtoCLIP, xCLIP's CLIP head): the metrics normalise z themselves.

    A method's other similarities subclass it in the method's module (``train/methods/clip.py``: product sphere,
    ``train/methods/nclip.py``: nCLIP's -CE), returned by ``Method.similarity_class``. Each is written as a dot
    product of an image embedding and a text embedding (``*_s`` features; the metrics are called with
    ``normalize=False``), so the metrics stay the same functions for every method::

        sim = similarity_of(spec.method, spec.similarity, spec.subspheres)
        image_s = sim.image(z, h)                          # [n, D]
        text_s = sim.text(sim.ensemble(sim.pre(z_t, h_t)))  # one class from its prompts
        score = image_s @ text_s.T
    """

    name = "cosine"
    dot_product = False  # True: scored through the ``*_s`` dot-product embeddings below
    distance = True  # s = -d for a distance d on the sphere: the temperature study (Eq. 1, Fig. 8) applies

    def __init__(self, subspheres: int = 1):
        self.subspheres = int(subspheres)

    @property
    def tokens(self) -> int:
        """Tokens whose subsets the temperature study scores separately (1: none)."""
        return 1

    def pre(self, z: torch.Tensor, h: torch.Tensor | None) -> torch.Tensor:
        """What a prompt ensemble averages, per text."""
        raise NotImplementedError(f"the {self.name} similarity has no dot-product form")

    def ensemble(self, pre: torch.Tensor) -> torch.Tensor:
        """[n_prompts, D] -> [1, D]: one class from its prompts (the mean of :meth:`pre`)."""
        return pre.mean(0, keepdim=True)

    def image(self, z: torch.Tensor, h: torch.Tensor | None) -> torch.Tensor:
        """Image embeddings whose dot product with :meth:`text` is the similarity."""
        raise NotImplementedError(f"the {self.name} similarity has no dot-product form")

    def text(self, pre: torch.Tensor) -> torch.Tensor:
        """Text embeddings from :meth:`pre` (or its prompt :meth:`ensemble`)."""
        raise NotImplementedError(f"the {self.name} similarity has no dot-product form")

    def zeroshot_extra(self, image_s: np.ndarray, classes_s: np.ndarray, labels: np.ndarray,
                       classify: Callable[..., dict[str, Any]]) -> dict[str, Any]:
        """Zero-shot variants the method's paper also reports, beside the headline ({} : none)."""
        return {}


def similarity_of(method: str | None, name: str, subspheres: int = 1) -> Similarity:
    """The similarity ``name`` of a model trained by ``method`` (None: saved without one, cosine only), from the
    method's class in the registry. ValueError when the method is unknown or has no such similarity."""
    cls = Similarity if method is None else method_class(method).similarity_class(name)
    if cls.name != name:
        raise ValueError(f"method {method!r} scores by {cls.name!r}, not {name!r}")
    return cls(subspheres)


__all__ = ["Similarity", "similarity_of"]
