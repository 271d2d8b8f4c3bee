"""External text teacher: frozen encoders (encoders.py) and the PCA feature cache stage (cache.py)."""
