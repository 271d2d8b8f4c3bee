"""Prototype construction: per-episode k-means over projected features (faiss or pure-torch backend)."""
from protoclip.prototypes.kmeans import KMeansResult, assign, kmeans, random_init, resolve_backend

__all__ = ["KMeansResult", "kmeans", "assign", "random_init", "resolve_backend"]
