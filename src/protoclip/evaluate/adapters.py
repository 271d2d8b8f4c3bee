"""One adapter per evaluation task (named by its :class:`protoclip.tasks.Task`): what it reads of a set's features
and which metric function it calls.

=========== ============================================ ====================================================
task        features (paper section)                      metric function
=========== ============================================ ====================================================
zeroshot    z^I vs prompt-ensembled z^T (IV-C1, Table VI) metrics.zeroshot.zeroshot_classify
linear      z^I, not normalised (IV-C2, Table VII)        metrics.linear.linear_probe / sgd_linear_probe;
            (another paper's protocol: evaluate.protocols)  metrics.linear_sgd.sgd_protocol_probe
knn         z^I, cosine, k=20, T=0.07 (IV-C3, Table VII)  metrics.knn.knn_classifier
retrieval   z^I vs z^T of captions (IV-C4, Table VIII)    metrics.retrieval.retrieval_recall
clustering  z^I of the test split (IV-G3, Table XII)      metrics.clustering.cluster_scores
nemd        h^I (and z^I) of the test split (PAUC)        metrics.nemd.nemd_report
tsne        z^I of the test split (Fig. 8)                metrics.embedding_plots.tsne_plot
temperature caption pairs, the run's similarity; token     metrics.temperature (temperature paper Fig. 1,
            subsets of a multi-token run's zero-shot      Fig. 8, Table 11; evaluate.temperature settings)
=========== ============================================ ====================================================

A run whose method scores by its own similarity (:mod:`protoclip.similarity`) is scored through the ``*_s``
dot-product embeddings with ``normalize=False``. The zero-shot classifier (prompt-ensembled class embeddings) is
built here, by the zero-shot task, from the model's text side (:class:`SetInput.text`); the temperature task's
token subsets reuse it.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np

from protoclip.evaluate.config import EvaluateConfig
from protoclip.evaluate.datasets import EvalSet
from protoclip.evaluate.protocols import PROTOCLIP, PROTOCOLS
from protoclip.evaluate.set_features import SetFeatures
from protoclip.similarity import Similarity
from protoclip.tasks import TASKS


class TextSide(Protocol):
    """The model's text tower as the zero-shot classifiers need it (protoclip.evaluate.features.FeatureExtractor)."""

    def text_encoder(self) -> Callable[[list[str]], Any]: ...

    def text_pre(self, texts: list[str]) -> Any: ...


@dataclass
class SetInput:
    """What a task reads on one set: its features, the set, the settings, the run's similarity and text side."""
    feats: SetFeatures
    ds: EvalSet
    cfg: EvaluateConfig
    figure: Path  # where a task that draws writes its figure (t-SNE)
    similarity: Similarity = field(default_factory=Similarity)
    text: TextSide | None = None
    classifiers: dict[str, np.ndarray] = field(default_factory=dict)  # built once per set: "z", "s"
    linear_protocol: str = PROTOCLIP  # the run's (EvaluateConfig.linear_protocol_of)


@dataclass
class TaskResult:
    """What a task returns: the metrics file's ``metrics``, what the task scored (``features``), the split sizes
    (top-level keys of the metrics file), and its per-example arrays (``<task>.examples.npz``,
    protoclip.files.records.write_examples; empty for a task whose number is no mean over test examples)."""
    metrics: dict[str, Any]
    features: str
    sizes: dict[str, int]
    examples: dict[str, np.ndarray] = field(default_factory=dict)


def adapter_of(task: str) -> Callable[[SetInput], TaskResult]:
    """The function that runs ``task``: its :class:`protoclip.tasks.Task`'s ``adapter`` ("module:function",
    imported here, or the function)."""
    ref = TASKS[task].adapter
    if callable(ref):
        return ref
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def _sizes(f: SetFeatures, train: bool = False) -> dict[str, int]:
    out = {"n_test": int(len(f.test_y))}
    if train:
        out["n_train"] = int(len(f.train_y))
    return out


def _with_labels(hits: dict[str, np.ndarray], f: SetFeatures) -> dict[str, np.ndarray]:
    """Per-image hits plus the test labels they were scored against (runs are paired on the same images)."""
    return {**hits, "labels": np.asarray(f.test_y)}


def zeroshot_classifier(x: SetInput) -> np.ndarray:
    """The set's prompt-ensembled class embeddings [C, D]: unit-norm mean z^T (cosine) or, for a method's own
    similarity, the text side of its dot product from the prompts' ensembled ``pre``. Built once per set."""
    key = "s" if x.similarity.dot_product else "z"
    if key not in x.classifiers:
        import torch
        from tqdm import tqdm

        from protoclip.evaluate.metrics.zeroshot import _fill, build_zeroshot_classifier

        ds, sim = x.ds, x.similarity
        if not sim.dot_product:
            x.classifiers[key] = build_zeroshot_classifier(x.text.text_encoder(), ds.classnames, ds.templates).numpy()
        else:
            rows = [sim.text(sim.ensemble(x.text.text_pre([_fill(t, c) for t in ds.templates])))
                    for c in tqdm(ds.classnames, desc=f"{ds.name} {sim.name} classifier", leave=False)]
            x.classifiers[key] = torch.cat(rows).numpy()
    return x.classifiers[key]


def task_zeroshot(x: SetInput) -> TaskResult:
    from protoclip.evaluate.metrics.zeroshot import zeroshot_classify

    f, sim = x.feats, x.similarity
    if sim.dot_product:
        classes = zeroshot_classifier(x)
        m, hits = zeroshot_classify(f.test_s, classes, f.test_y, normalize=False, per_example=True)
        what = f"{sim.name} similarity (image vs prompt-ensembled text)"
        m.update(sim.zeroshot_extra(f.test_s, classes, f.test_y, zeroshot_classify))
    else:
        m, hits = zeroshot_classify(f.test_z, zeroshot_classifier(x), f.test_y, per_example=True)
        what = "z_image (L2-normalised) vs prompt-ensembled z_text"
    m["n_classes"], m["n_templates"] = len(x.ds.classnames), len(x.ds.templates)
    return TaskResult(m, what, _sizes(f), _with_labels(hits, f))


def task_linear(x: SetInput) -> TaskResult:
    """The run's linear protocol on z^I: ProtoCLIP's (L-BFGS, SGD above linear_sgd_above samples) or a paper's
    own SGD recipe (evaluate.protocols); ``protocol`` in the metrics names it."""
    from protoclip.evaluate.metrics.linear import linear_probe, sgd_linear_probe

    f, cfg = x.feats, x.cfg
    args = (f.train_z, f.train_y, f.test_z, f.test_y)
    if x.linear_protocol != PROTOCLIP:
        from protoclip.jobs.devices import resolve_device
        from protoclip.evaluate.metrics.linear_sgd import sgd_protocol_probe

        m, hits = sgd_protocol_probe(*args, PROTOCOLS[x.linear_protocol], seed=cfg.seed,
                                     num_classes=len(x.ds.classnames), device=resolve_device(cfg.device),
                                     per_example=True)
        m["solver"] = "sgd"
    elif len(f.train_y) > cfg.linear_sgd_above:  # paper: SGD for ImageNet, L-BFGS for the small sets
        m, hits = sgd_linear_probe(*args, seed=cfg.seed, num_classes=len(x.ds.classnames), per_example=True)
        m["solver"] = "sgd"
    else:
        m, hits = linear_probe(*args, seed=cfg.seed, max_iter=cfg.linear_max_iter, center=cfg.linear_center,
                               steps_per_decade=cfg.linear_steps_per_decade, per_example=True)
        m.update(solver="lbfgs", centred=cfg.linear_center)
    m["protocol"] = x.linear_protocol
    return TaskResult(m, "z_image (not normalised)", _sizes(f, train=True), _with_labels(hits, f))


def task_knn(x: SetInput) -> TaskResult:
    from protoclip.evaluate.metrics.knn import knn_classifier

    f, cfg = x.feats, x.cfg
    m, hits = knn_classifier(f.train_z, f.train_y, f.test_z, f.test_y, k=cfg.knn_k,
                             T=cfg.knn_temperature, num_classes=len(x.ds.classnames), per_example=True)
    m["k"], m["T"] = cfg.knn_k, cfg.knn_temperature
    return TaskResult(m, "z_image (L2-normalised, cosine)", _sizes(f, train=True), _with_labels(hits, f))


def task_retrieval(x: SetInput) -> TaskResult:
    from protoclip.evaluate.metrics.retrieval import retrieval_recall

    f = x.feats
    if x.similarity.dot_product:
        m, ranks = retrieval_recall(f.caption_image_s, f.caption_text_s, f.caption_text_to_image,
                                    normalize=False, per_example=True)
        what = f"{x.similarity.name} similarity"
    else:
        m, ranks = retrieval_recall(f.caption_image_z, f.caption_text_z, f.caption_text_to_image,
                                    per_example=True)
        what = "z_image vs z_text (L2-normalised, dot product)"
    sizes = {"n_images": int(len(f.caption_image_z)), "n_texts": int(len(f.caption_text_z))}
    return TaskResult(m, what, sizes, {**ranks, "text_to_image": np.asarray(f.caption_text_to_image)})


def task_clustering(x: SetInput) -> TaskResult:
    from protoclip.evaluate.metrics.clustering import cluster_scores

    m, assign = cluster_scores(x.feats.test_z, x.feats.test_y, seed=x.cfg.seed, per_example=True)
    return TaskResult(m, "z_image (L2-normalised)", _sizes(x.feats), _with_labels(assign, x.feats))


def task_nemd(x: SetInput) -> TaskResult:
    from protoclip.evaluate.metrics.nemd import nemd_report

    f, cfg = x.feats, x.cfg
    # methods-spec 3.4: NEMD on h^I (the prototype space) and on z^I separately; h^I is the headline
    m = nemd_report(f.test_h, f.test_y, seed=cfg.seed, max_pairs=cfg.nemd_max_pairs)
    m["z_image"] = nemd_report(f.test_z, f.test_y, seed=cfg.seed, max_pairs=cfg.nemd_max_pairs)
    return TaskResult(m, "h_image (projection head g^I); z_image under 'z_image'", _sizes(f))


def task_tsne(x: SetInput) -> TaskResult:
    from protoclip.evaluate.metrics.embedding_plots import tsne_plot

    m = tsne_plot(x.feats.test_z, x.feats.test_y, x.ds.classnames, x.figure, seed=x.cfg.seed,
                  max_points=x.cfg.tsne_max_points, title=f"{x.ds.name}: t-SNE of z_image")
    m["figure"] = str(x.figure)
    return TaskResult(m, "z_image (L2-normalised)", _sizes(x.feats))


def task_temperature(x: SetInput) -> TaskResult:
    """Only for a similarity that is a distance (protoclip.evaluate.plan.too_small)."""
    from protoclip.jobs.devices import resolve_device
    from protoclip.evaluate.metrics import temperature as tm

    f, cfg, sim = x.feats, x.cfg, x.similarity
    t = cfg.temperature
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


__all__ = ["SetInput", "TaskResult", "TextSide", "adapter_of", "zeroshot_classifier"]
