"""Models: open_clip encoders + ProtoCLIP projection heads (see protoclip.models.build)."""
from protoclip.models.build import CONFIG_DIR, build_model, get_tokenizer, model_config
from protoclip.models.checkpoint import EvalSpec, load_model, read_eval_spec, save_model
from protoclip.models.model import ProjectionHead, ProtoCLIPModel

__all__ = [
    "CONFIG_DIR", "EvalSpec", "ProjectionHead", "ProtoCLIPModel", "build_model", "get_tokenizer", "load_model",
    "model_config", "read_eval_spec", "save_model",
]
