"""Zero-shot classification: z^I against the prompt-ensembled z^T of the class names (paper Sec. IV-C1, Table VI;
:func:`protoclip.evaluate.metrics.zeroshot.zeroshot_classify`). A run whose method scores by its own similarity
(:mod:`protoclip.similarity`) is scored through the ``*_s`` dot-product embeddings with ``normalize=False``.
The classifier (prompt-ensembled class embeddings, :func:`protoclip.evaluate.tasks.base.zeroshot_classifier`)
is built from the model's text side once per set; the temperature task's token subsets reuse it."""
from __future__ import annotations

from protoclip.claims.ledger import chance_level
from protoclip.evaluate.tasks.base import SetInput, TaskResult, sizes, with_labels, zeroshot_classifier
from protoclip.tasks import Task, register


def task_zeroshot(x: SetInput) -> TaskResult:
    from protoclip.evaluate.metrics.zeroshot import zeroshot_classify  # heavy: torch, config loads tasks

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
    return TaskResult(m, what, sizes(f), with_labels(hits, f))


def chance(metrics: dict) -> float | None:
    """Chance top-1 in % (the ledger's rule, 100 / classes), from the metrics file's ``n_classes`` (the
    classifier's classes)."""
    return chance_level("top1", classes=metrics["n_classes"]) if "n_classes" in metrics else None


TASK = register(Task("zeroshot", ("top1", "top5"), task_zeroshot, templates=True, text=True, examples="hits",
                     validation=True, order=10, chance=chance, title="Zero-shot"))  # Table VI

__all__ = ["TASK", "chance", "task_zeroshot", "zeroshot_classifier"]
