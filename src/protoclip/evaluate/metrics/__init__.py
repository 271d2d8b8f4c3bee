"""Pure evaluation metrics: features (numpy or torch) and labels in, JSON-able dicts out.

No file I/O (except :func:`tsne_plot`, which writes the PNG it is given) and no tracking imports;
the ``evaluate`` stage (``protoclip.evaluate.stage``) extracts features and calls these.

| module | function | paper |
|---|---|---|
| zeroshot | build_zeroshot_classifier, zeroshot_classify | ProtoCLIP IV-C1 (CLIP prompt ensembling) |
| linear | linear_probe (L-BFGS), sgd_linear_probe, linear_eval | IV-C2 |
| linear_sgd | sgd_protocol_probe (PCL's, nCLIP's, MoCo v3's SGD probes; evaluate.protocols) | PCL App. E, nCLIP 4.2.1, temperature App. A |
| knn | knn_classifier (DINO weighted vote, k=20, T=0.07) | IV-C3 |
| retrieval | retrieval_recall (R@1/5/10 both ways, mean recall) | IV-C4 |
| clustering | cluster_scores (k-means, ARI, AMI) | IV-G3, Table XII |
| nemd | nemd, uniformity, intra_class_spread, nemd_report | methods-spec §3.4 |
| embedding_plots | tsne_plot | Fig. 8 |

Accuracies and recalls are percentages; ARI/AMI in [-1, 1]; NEMD in [0, 2].
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
