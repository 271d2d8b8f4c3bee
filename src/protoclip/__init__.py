"""protoclip-repro: reproducible ProtoCLIP (prototypical contrastive language-image pretraining)."""
__version__ = "0.1.0"
