"""Pure evaluation metrics: features (numpy or torch) and labels in, JSON-able dicts out (accuracies and recalls in
percent, ARI / AMI in [-1, 1], NEMD in [0, 2]). No file I/O (except :func:`tsne_plot`, which writes the PNG it is
given) and no tracking imports: the ``evaluate`` stage extracts features and calls these. Each function's paper
section: docs/evaluation-sets.md#protoclipevaluatemetrics.
"""
from protoclip.evaluate.metrics.clustering import cluster_scores
from protoclip.evaluate.metrics.embedding_plots import tsne_plot
from protoclip.evaluate.metrics.knn import knn_classifier
from protoclip.evaluate.metrics.linear import linear_eval, linear_probe, sgd_linear_probe
# the function `nemd` is deliberately NOT re-exported: it would shadow the submodule `metrics.nemd`
# (then `import protoclip.evaluate.metrics.nemd as m` would bind the function). Use
# `from protoclip.evaluate.metrics.nemd import nemd`.
from protoclip.evaluate.metrics.nemd import intra_class_spread, kmeans_partition, nemd_report, uniformity
from protoclip.evaluate.metrics.retrieval import retrieval_recall
from protoclip.evaluate.metrics.zeroshot import build_zeroshot_classifier, zeroshot_classify

__all__ = [
    "build_zeroshot_classifier", "zeroshot_classify", "linear_probe", "sgd_linear_probe", "linear_eval",
    "knn_classifier", "retrieval_recall", "cluster_scores", "uniformity", "intra_class_spread",
    "kmeans_partition", "nemd_report", "tsne_plot",
]
