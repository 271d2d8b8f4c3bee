"""One evaluation set's frozen features as a run's evaluation reads them (:class:`SetFeatures`), and their cache file
``results/runs/<run>/features/<set>.npz``: the present arrays under their field names and a ``meta_json`` entry,
what they were extracted from (protoclip.evaluate.features.FeatureExtractor.cache_key).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from protoclip.files.atomic import atomic_path

META = "meta_json"


@dataclass
class SetFeatures:
    """For a labelled set: image features ``z^I`` (encoder output, not normalised: linear probing uses them as is,
    the other metrics normalise), ``h^I = g^I(z^I)`` (projection head output: the prototype space, used by NEMD) and
    labels, of the test and of the train split. For a caption set (or the captions of ``heldout_pairs``): ``z^I`` of
    its images, ``z^T`` of every caption and ``text_to_image``. Where the run's method scores image-text pairs by a
    similarity of its own (:mod:`protoclip.similarity`), that similarity's dot-product embeddings too: ``test_s`` (a
    set with prompt templates), ``caption_image_s`` / ``caption_text_s``. Absent arrays are None (a caption set has
    no ``test_y``; a split left empty is not extracted)."""
    test_z: np.ndarray | None = None  # [N_test, d] z^I of the test split
    test_h: np.ndarray | None = None  # [N_test, d_h] h^I = g^I(z^I)
    test_y: np.ndarray | None = None  # [N_test] class index
    train_z: np.ndarray | None = None  # the train split's, for the probes
    train_h: np.ndarray | None = None
    train_y: np.ndarray | None = None
    test_s: np.ndarray | None = None  # the method's own similarity: image side of its dot product (test split)
    caption_image_z: np.ndarray | None = None  # [N_images, d] z^I of a caption set's images
    caption_text_z: np.ndarray | None = None  # [N_texts, d] z^T of every caption
    caption_text_to_image: np.ndarray | None = None  # [N_texts] the image each caption describes
    caption_image_s: np.ndarray | None = None  # the method's own similarity: both sides of its dot product
    caption_text_s: np.ndarray | None = None

    @property
    def labelled(self) -> bool:
        return self.test_y is not None

    @property
    def captions(self) -> bool:
        return self.caption_image_z is not None

    def arrays(self) -> dict[str, np.ndarray]:
        """The present arrays by field name."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}

    def save(self, path: Path, meta: dict[str, Any]) -> None:
        """Write the cache file atomically (np.savez on a file object: no ".npz" appended to the temp name)."""
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.savez(f, **{META: np.array(json.dumps(meta, sort_keys=True))}, **self.arrays())

    @classmethod
    def load(cls, path: Path, meta: dict[str, Any] | None = None) -> SetFeatures | None:
        """The cache file's arrays; None when ``meta`` is given and the file was extracted from something else."""
        with np.load(path, allow_pickle=False) as z:
            if meta is not None and (META not in z.files or json.loads(str(z[META])) != meta):
                return None
            names = {f.name for f in fields(cls)}
            return cls(**{k: z[k] for k in z.files if k in names})


__all__ = ["SetFeatures"]
