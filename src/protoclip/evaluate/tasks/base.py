"""What a task's adapter reads on one set (:class:`SetInput`) and returns (:class:`TaskResult`), and what several
tasks compute alike (split sizes, per-image labels, the zero-shot classifier that zero-shot and the temperature
study's token subsets share). Light on purpose: the config loader imports the task modules
(protoclip.tasks.load_tasks)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from protoclip.similarity import Similarity

if TYPE_CHECKING:  # annotations only: numpy, the data sets and the config are the evaluation's, not the loader's
    import numpy as np

    from protoclip.evaluate.config import EvaluateConfig
    from protoclip.evaluate.datasets import EvalSet
    from protoclip.evaluate.set_features import SetFeatures


class TextSide(Protocol):
    """The model's text tower as the zero-shot classifiers need it (protoclip.evaluate.features.FeatureExtractor)."""

    def text_encoder(self) -> Callable[[list[str]], Any]: ...

    def text_pre(self, texts: list[str]) -> Any: ...


@dataclass
class SetInput:
    """What a task reads on one set: its features, the set, the settings (``cfg.<task>``: a task's own section),
    the run's similarity and text side."""
    feats: SetFeatures
    ds: EvalSet
    cfg: EvaluateConfig
    figure: Path | None  # where a task that draws writes its figure (t-SNE)
    similarity: Similarity = field(default_factory=Similarity)
    text: TextSide | None = None
    classifiers: dict[str, np.ndarray] = field(default_factory=dict)  # built once per set: "z", "s"
    run: str = ""  # the run evaluated (a task's settings may depend on it: the linear protocol)


@dataclass
class TaskResult:
    """What a task returns: the metrics file's ``metrics``, what the task scored (``features``), the split sizes
    (top-level keys of the metrics file), and its per-example arrays (``<task>.examples.npz``,
    protoclip.files.records.write_examples; empty for a task whose number is no mean over test examples)."""
    metrics: dict[str, Any]
    features: str
    sizes: dict[str, int]
    examples: dict[str, np.ndarray] = field(default_factory=dict)


def sizes(f: SetFeatures, train: bool = False) -> dict[str, int]:
    """The test (and train) split sizes a labelled task's metrics file records."""
    out = {"n_test": int(len(f.test_y))}
    if train:
        out["n_train"] = int(len(f.train_y))
    return out


def with_labels(hits: dict[str, np.ndarray], f: SetFeatures) -> dict[str, np.ndarray]:
    """Per-image hits plus the test labels they were scored against (runs are paired on the same images)."""
    import numpy as np  # heavy: numpy, config loads tasks

    return {**hits, "labels": np.asarray(f.test_y)}


def classes_with(f: SetFeatures, min_images: int = 1) -> int:
    """How many classes have at least ``min_images`` test images (the minimum-data rules)."""
    import numpy as np  # heavy: numpy, config loads tasks

    return int((np.bincount(f.test_y) >= min_images).sum())


def zeroshot_classifier(x: SetInput) -> np.ndarray:
    """The set's prompt-ensembled class embeddings [C, D]: unit-norm mean z^T (cosine) or, for a method's own
    similarity, the text side of its dot product from the prompts' ensembled ``pre``. Built once per set."""
    key = "s" if x.similarity.dot_product else "z"
    if key not in x.classifiers:
        import torch  # heavy: torch, config loads tasks
        from tqdm import tqdm  # heavy: tqdm, config loads tasks

        from protoclip.evaluate.metrics.zeroshot import (_fill,
                                                         build_zeroshot_classifier)  # heavy: torch, config loads tasks

        ds, sim = x.ds, x.similarity
        if not sim.dot_product:
            x.classifiers[key] = build_zeroshot_classifier(x.text.text_encoder(), ds.classnames, ds.templates).numpy()
        else:
            rows = [sim.text(sim.ensemble(x.text.text_pre([_fill(t, c) for t in ds.templates])))
                    for c in tqdm(ds.classnames, desc=f"{ds.name} {sim.name} classifier", leave=False)]
            x.classifiers[key] = torch.cat(rows).numpy()
    return x.classifiers[key]


__all__ = ["SetInput", "TaskResult", "TextSide", "classes_with", "sizes", "with_labels", "zeroshot_classifier"]
