"""open_clip architecture configs read without importing torch, and the checks a run's model keys must pass.

``load_config`` runs where torch is not wanted (Snakemake parsing the config, ``protoclip runs``), yet model keys
the architecture cannot take would otherwise fail seconds into the job inside open_clip: :func:`check_model`
applies the build-time rules of ``protoclip.models.build`` at config load instead.
"""
from __future__ import annotations

import ast
import difflib
import functools
import importlib.util
import json
from pathlib import Path

OURS = Path(__file__).resolve().parents[1] / "models" / "configs"  # = protoclip.models.build.CONFIG_DIR


# image-only torchvision backbones by name -> (torchvision builder, width of the pooled feature z); PCL and PAUC
# train "a ResNet-50 ... whose last fully-connected layer outputs a 128-D ... feature" [pcl-protonce.txt l.150,
# pauc-nemd.txt l.156]: torchvision's resnet50 (MoCo's and PCL's code build it), its fc replaced by the method's head
TORCHVISION_MODELS = {"tv-resnet50": ("resnet50", 2048)}


def is_torchvision(name: str) -> bool:
    """Whether model ``name`` is an image-only torchvision backbone (:data:`TORCHVISION_MODELS`)."""
    return name in TORCHVISION_MODELS


def check_torchvision(name: str, *, embed_dim: int | None, context_length: int | None, image_size: int | None,
                      class_tokens: int) -> None:
    """The keys an image-only torchvision backbone cannot take (it has no text tower and a fixed width)."""
    width = TORCHVISION_MODELS[name][1]
    if embed_dim is not None and embed_dim != width:
        raise ValueError(f"embed_dim: model '{name}' pools a fixed {width}-d feature; set embed_dim: null")
    if context_length is not None:
        raise ValueError(f"context_length: model '{name}' has no text tower; set context_length: null")
    if class_tokens:
        raise ValueError(f"class_tokens: model '{name}' is a ResNet; class tokens need a ViT")
    if image_size is not None and image_size < 32:  # five 2x downsamplings: below 32 px the last stage is 0 px
        raise ValueError(f"image_size must be >= 32 for model '{name}', got {image_size}")


@functools.lru_cache(maxsize=None)
def config_dirs() -> tuple[Path, ...]:
    """open_clip's own config folder, then ours (ours win on a name clash, as in open_clip's registry)."""
    spec = importlib.util.find_spec("open_clip")  # locates the package without executing it
    dirs = [Path(loc) / "model_configs" for loc in (spec.submodule_search_locations or [])] if spec else []
    return (*dirs, OURS)


@functools.lru_cache(maxsize=None)
def known_models() -> dict[str, Path]:
    """{model name: its JSON file} of every registered config."""
    out: dict[str, Path] = {}
    for folder in config_dirs():
        for f in sorted(folder.glob("*.json")):
            out[f.stem] = f
    return out


def model_json(name: str) -> dict | None:
    """The architecture config (embed_dim, vision_cfg, text_cfg) of ``name``; None for ``hf-hub:`` names.
    Raises ValueError for an unknown name.

    The configs are the JSON files open_clip reads (located with importlib, not imported) plus
    ``protoclip/models/configs/``; a ``local-dir:`` name reads that folder's config; ``hf-hub:`` names are not
    checked (nothing here goes online)."""
    if name.startswith("hf-hub:"):
        return None
    if name.startswith("local-dir:"):
        path = Path(name[len("local-dir:"):]) / "open_clip_config.json"
        if not path.is_file():
            raise ValueError(f"model '{name}': {path} not found")
        config = json.loads(path.read_text("utf-8"))
        return config.get("model_cfg", config)
    models = known_models()
    if name not in models:
        near = difflib.get_close_matches(name, list(models), n=6) or ["tiny-rn", "tiny-vit", "RN50", "RN101",
                                                                       "ViT-B-32"]
        raise ValueError(f"model: unknown open_clip model '{name}' (close: {', '.join(near)}; "
                         f"{len(models)} configs known)")
    return json.loads(models[name].read_text("utf-8"))


def image_step(vision_cfg: dict) -> int:
    """Input sizes must be positive multiples of this: a ViT's patch size (whole patches), else 32
    (ModifiedResNet downsamples 32x and its attention pool is sized (image_size / 32)^2)."""
    return int(vision_cfg["patch_size"]) if vision_cfg.get("patch_size") else 32


def default_image_size(vision_cfg: dict) -> int:
    size = vision_cfg.get("image_size", 224)
    return int(size[0] if isinstance(size, (list, tuple)) else size)


def multitoken_problem(cfg: dict) -> str | None:
    """Why the towers of ``cfg`` cannot take m class tokens (protoclip.models.multitoken), or None."""
    vision, text = cfg.get("vision_cfg", {}), cfg.get("text_cfg", {})
    if vision.get("timm_model_name") or not vision.get("patch_size"):
        return "a ViT image tower (this model's is not)"
    if vision.get("attentional_pool") or vision.get("pool_type", "tok") != "tok":
        return "a ViT with plain class-token pooling (this one pools otherwise)"
    # TextTransformer: a cls token, no causal mask, no projection ('none') or a biased Linear one all differ
    if text.get("hf_model_name") or text.get("embed_cls") or text.get("no_causal_mask") or \
            text.get("proj_type") == "none" or text.get("proj_bias"):
        return "open_clip's causal CLIP text transformer (this model's text tower differs)"
    return None


def check_model(name: str, *, embed_dim: int | None = None, context_length: int | None = None,
                image_size: int | None = None, class_tokens: int = 0, distance: str = "sphere",
                subspheres: int = 1) -> None:
    """Raise ValueError naming the key when open_clip model ``name`` cannot be built with these settings.

    The keys checked are the model name, ``embed_dim``, ``context_length``, ``image_size``, ``class_tokens`` and
    ``loss.subspheres`` (``tv-resnet50``, torchvision's image-only ResNet-50, by :func:`check_torchvision`)::

        check_model("tiny-vit", class_tokens=4, image_size=64)   # ok
        check_model("tiny-rn", class_tokens=4)                     # ValueError: class_tokens ... needs a ViT
    """
    if embed_dim is not None and embed_dim < 1:
        raise ValueError(f"embed_dim must be >= 1 or null, got {embed_dim}")
    if context_length is not None and context_length < 2:
        raise ValueError(f"context_length must be >= 2 (start and end tokens) or null, got {context_length}")
    if image_size is not None and image_size < 1:
        raise ValueError(f"image_size must be >= 1 or null, got {image_size}")
    if is_torchvision(name):
        check_torchvision(name, embed_dim=embed_dim, context_length=context_length, image_size=image_size,
                          class_tokens=class_tokens)
        return
    cfg = model_json(name)
    if cfg is None:
        return
    vision = cfg.get("vision_cfg", {})
    if image_size is not None and image_size != default_image_size(vision) and not vision.get("timm_model_name"):
        step = image_step(vision)
        if image_size % step:
            raise ValueError(f"image_size must be a multiple of {step} for model '{name}' "
                             f"({'its patch size' if vision.get('patch_size') else 'ResNet downsampling'}), "
                             f"got {image_size}")
    if class_tokens > 0:
        problem = multitoken_problem(cfg)
        if problem:
            raise ValueError(f"class_tokens: {class_tokens} class tokens need {problem.replace('this model', name)}")
    if distance.startswith("ps_"):
        width = (embed_dim if embed_dim is not None else int(cfg["embed_dim"])) * max(class_tokens, 1)
        if width % subspheres:
            raise ValueError(f"loss.subspheres: {subspheres} subspheres must divide the feature width "
                             f"{width} (embed_dim x max(class_tokens, 1)) of model '{name}'")


LOCAL_DIR = "local-dir:"  # open_clip's schema for a model folder (open_clip_config.json + weights)


@functools.lru_cache(maxsize=None)
def released_tags() -> dict[str, tuple[str, ...]]:
    """{open_clip model name: its pretrained tags} as ``open_clip.list_pretrained()`` gives them, read from
    ``open_clip/pretrained.py`` without importing it (it imports torch): each ``_PRETRAINED`` entry is a
    ``dict(tag=_pcfg(...), ...)``, inline or named, and every model with QuickGELU tags also has a ``-quickgelu``
    name with those tags (the module's own loop). Imports open_clip only when the file does not parse that way."""
    spec = importlib.util.find_spec("open_clip")
    try:
        file = Path(next(iter(spec.submodule_search_locations or []))) / "pretrained.py"
        tree = ast.parse(file.read_text("utf-8"))
        named = {n.targets[0].id: n.value for n in tree.body
                 if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)}

        def tags(node) -> dict[str, bool]:  # {tag: quick_gelu}
            node = named.get(node.id) if isinstance(node, ast.Name) else node
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "dict"):
                raise ValueError("not a dict(...) of tags")
            return {kw.arg: any(k.arg == "quick_gelu" and getattr(k.value, "value", False) is True
                                for k in getattr(kw.value, "keywords", [])) for kw in node.keywords if kw.arg}

        table = named["_PRETRAINED"]
        out = {k.value: tags(v) for k, v in zip(table.keys, table.values)}
        out.update({f"{m}-quickgelu": {t: True for t, q in ts.items() if q} for m, ts in list(out.items())
                    if any(ts.values())})
        return {m: tuple(ts) for m, ts in out.items()}
    except (StopIteration, OSError, SyntaxError, KeyError, AttributeError, TypeError, ValueError):
        import open_clip  # heavy: open_clip (torch), only for another layout of its pretrained.py

        out: dict[str, list[str]] = {}
        for model, tag in open_clip.list_pretrained():
            out.setdefault(model, []).append(tag)
        return {m: tuple(ts) for m, ts in out.items()}


def check_pretrained(model: str | None, tag: str | None) -> None:
    """Raise ValueError naming the key (of a run's ``pretrained`` section) unless it names a released open_clip
    checkpoint: ``model`` an open_clip model with pretrained tags and ``tag`` one of them
    (``open_clip.list_pretrained()``), or ``tag`` a ``local-dir:<folder>`` with no model (the folder names its
    architecture; that it exists is checked when the evaluation loads it: an export the same workflow makes may not
    exist yet when the config is read)."""
    if tag is None:
        if model is not None:
            raise ValueError(f"model '{model}' needs a tag (an open_clip pretrained tag or "
                             f"{LOCAL_DIR}<folder>)")
        return
    if tag.startswith(LOCAL_DIR):
        if not tag[len(LOCAL_DIR):].strip():
            raise ValueError(f"tag '{tag}': no folder after '{LOCAL_DIR}'")
        if model is not None:
            raise ValueError(f"model must be null with tag '{tag}': the folder's "
                             "open_clip_config.json names the architecture")
        return
    released = released_tags()
    if model is None or model not in released:
        near = difflib.get_close_matches(model or "", list(released), n=6) or ["RN50", "RN101", "ViT-B-32"]
        raise ValueError(f"model: {'no model given' if model is None else f'unknown model {model!r}'} "
                         f"(open_clip models with released weights include: {', '.join(near)})")
    if tag not in released[model]:
        raise ValueError(f"tag: '{tag}' is not a released checkpoint of open_clip model '{model}' "
                         f"(its tags: {', '.join(released[model])})")


__all__ = ["LOCAL_DIR", "TORCHVISION_MODELS", "check_model", "check_torchvision", "is_torchvision",
           "check_pretrained", "config_dirs", "released_tags", "default_image_size",
           "image_step", "known_models", "model_json",
           "multitoken_problem"]
