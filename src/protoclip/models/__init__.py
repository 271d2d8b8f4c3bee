"""Models: open_clip encoders + ProtoCLIP projection heads (see protoclip.models.build)."""
from protoclip.models.build import CONFIG_DIR, build_model, get_tokenizer, model_config
from protoclip.models.checkpoint import load_model, save_model
from protoclip.models.model import ProjectionHead, ProtoCLIPModel

__all__ = [
    "CONFIG_DIR", "ProjectionHead", "ProtoCLIPModel", "build_model", "get_tokenizer", "load_model",
    "model_config", "save_model",
]
