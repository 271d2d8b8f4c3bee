"""Image-text retrieval: z^I against z^T of the captions, recall at 1 / 5 / 10 both ways (paper Sec. IV-C4,
Table VIII; :func:`protoclip.evaluate.metrics.retrieval.retrieval_recall`). Per-example: each query's first-match
rank, the ledger's resampling unit (an image with its captions)."""
from __future__ import annotations

from protoclip.evaluate.tasks.base import SetInput, TaskResult
from protoclip.tasks import Task, register


def task_retrieval(x: SetInput) -> TaskResult:
    import numpy as np  # heavy: numpy, config loads tasks

    from protoclip.evaluate.metrics.retrieval import retrieval_recall  # heavy: torch, config loads tasks

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


TASK = register(Task("retrieval", ("mean_recall", "image_to_text_R@1", "text_to_image_R@1"),  # Table VIII
                     task_retrieval, labels=False, captions=True, text=True, examples="ranks", validation=True,
                     order=40))

__all__ = ["TASK", "task_retrieval"]
