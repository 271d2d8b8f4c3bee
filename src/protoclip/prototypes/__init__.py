"""Prototype construction: per-episode k-means over projected features (faiss or pure-torch backend) and the
episode's prototype classifiers (PBT)."""
from protoclip.prototypes.episode import EpisodePrototypes, pbt_centroids
from protoclip.prototypes.kmeans import KMeansResult, assign, kmeans, random_init, resolve_backend

__all__ = ["EpisodePrototypes", "KMeansResult", "kmeans", "assign", "pbt_centroids", "random_init",
           "resolve_backend"]
