"""Export a trained run as an open_clip model folder, for the field's own tools (open_clip, CLIP_benchmark).

    protoclip export --config config/config.yaml --run clip_tiny_s0 [--out DIR]   # default results/export/<run>

What the folder holds and which runs are refused: docs/export.md.
"""
from __future__ import annotations

import copy
import logging
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

from open_clip.transform import PreprocessCfg
from safetensors.torch import save as safetensors_bytes

from protoclip.config.architectures import is_torchvision
from protoclip.config.protocols import Project
from protoclip.config.strict import require_path
from protoclip.files.atomic import atomic_path, clean_stale_temps, write_json
from protoclip.files.hashing import sha256_file
from protoclip.files.layout import Layout
from protoclip.models.build import architecture_overrides, model_config
from protoclip.models.checkpoint import load_model, read_eval_spec

log = logging.getLogger(__name__)

WEIGHTS_FILE = "open_clip_model.safetensors"  # first in open_clip's preferred order (factory._find_checkpoint_in_dir)
CONFIG_FILE = "open_clip_config.json"  # what `local-dir:` and `hf-hub:` read (model_cfg + preprocess_cfg)


class ExportError(ValueError):
    """A run open_clip cannot represent; the message says why in one line."""


def open_clip_model_cfg(model) -> dict:
    """The open_clip ``model_cfg`` of a :class:`~protoclip.models.ProtoCLIPModel` (its name's config plus the
    architecture overrides it was built with)."""
    cfg = copy.deepcopy(model_config(model.name))
    cfg.update(architecture_overrides(cfg, model.embed_dim, model.context_length, model.image_size))
    return cfg


def preprocess_cfg(image_size: int) -> dict:
    """open_clip's inference preprocessing at ``image_size``: what ``eval_transform`` builds (open_clip's
    ``image_transform(size, is_train=False)`` with its defaults: OpenAI mean / std, bicubic, shortest-side resize)."""
    out = asdict(PreprocessCfg(size=int(image_size)))
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in out.items()}


def export_refusal(run: str, method: str | None, similarity: str, class_tokens: int,
                   model: str | None = None) -> str | None:
    """Why a run cannot be exported to open_clip (one line), or None when it can. ``similarity``: the evaluation
    similarity its method declares (:class:`~protoclip.models.checkpoint.EvalSpec`); ``model``: its model name."""
    if model is not None and is_torchvision(model):
        return (f"run '{run}' ({method}): model '{model}' is an image-only torchvision backbone, not an open_clip "
                "architecture; use its model.pt (protoclip.models.load_model)")
    if class_tokens > 0:
        return (f"run '{run}' ({method}): multi-class-token towers (class_tokens={class_tokens}) are not an "
                "open_clip architecture; open_clip cannot load them")
    if similarity != "cosine":
        return (f"run '{run}' ({method}) scores image-text pairs by '{similarity}', not by the cosine of the towers' "
                "embeddings that open_clip models compute; its numbers would not carry over")
    return None


def export_notes(model, config: dict, spec) -> list[str]:
    """Why the run cannot be exported (raises :class:`ExportError`), else the notes that go with the export.
    ``spec``: the model file's :class:`~protoclip.models.checkpoint.EvalSpec`."""
    method = spec.method or config.get("method")
    refusal = export_refusal(config.get("name", "?"), method, spec.similarity, int(getattr(model, "class_tokens", 0)),
                             model.name)
    if refusal:
        raise ExportError(refusal)
    notes = ["projection heads g^I, g^T (prototype space) and tau_Proto are not exported: open_clip tools use the "
             "towers' embeddings z only"]
    if spec.image_only:
        notes.append(f"image-only method ({method}): the text tower is untrained, so zero-shot and retrieval "
                     "numbers are chance; use the image tower (linear probe, kNN)")
    return notes


def export_openclip(model_path: str | Path, out_dir: str | Path) -> Path:
    """Write the open_clip folder of the model file ``model_path`` to ``out_dir``; returns ``out_dir``."""

    model_path, out_dir = Path(model_path), Path(out_dir)
    model, config = load_model(model_path)
    spec = read_eval_spec(model_path)
    notes = export_notes(model, config, spec)
    out_dir.mkdir(parents=True, exist_ok=True)
    clean_stale_temps(out_dir, recursive=False)
    (out_dir / CONFIG_FILE).unlink(missing_ok=True)  # written last: a folder without it is an unfinished export
    state = {k: v.detach().cpu().contiguous() for k, v in model.clip.state_dict().items()}
    with atomic_path(out_dir / WEIGHTS_FILE) as tmp:
        tmp.write_bytes(safetensors_bytes(state, metadata={"format": "pt"}))
    write_json(out_dir / CONFIG_FILE, {
        "model_cfg": open_clip_model_cfg(model),
        "preprocess_cfg": preprocess_cfg(model.image_size),
        "protoclip": {"run": config.get("name"), "method": spec.method or config.get("method"),
                      "model_name": model.name,
                      "source": str(model_path), "source_sha256": sha256_file(model_path), "notes": notes},
    })
    for note in notes[1:]:
        log.warning("export %s: %s", config.get("name"), note)
    log.info("exported %s to %s (open_clip local-dir:%s)", model_path, out_dir, out_dir)
    return out_dir


def export_or_copy(model_path: Path, folder: Path) -> str:
    """The files of a model's MLflow version in ``folder``: its open_clip export where open_clip can represent the
    model (so that ``local-dir:`` reads the downloaded version as is), else ``model.pt`` itself (e.g. nCLIP's
    similarity). Returns what open_clip reads of it: ``local-dir``, or ``no: <why>``."""
    try:
        export_openclip(model_path, folder)
        return "local-dir"
    except ExportError as err:
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy2(model_path, folder / model_path.name)
        return f"no: {err}"


def run_export(cfg: Project, run: str, out: str | Path | None = None) -> Path:
    """``protoclip export``, the stage's entry: of the config it reads the run's name (an unknown run is a config
    error naming the defined ones) and the layout, which names the run's ``model.pt`` and the default ``out``
    (``results/export/<run>``); :func:`export_openclip` gets those two paths."""
    cfg.run(run)
    layout = Layout.from_config(cfg)
    model_path = require_path(layout.model(run), f"export run '{run}'")
    return export_openclip(model_path, out if out is not None else layout.export_dir(run))


def add_arguments(p, name: str) -> None:
    p.add_argument("--run", required=True)
    p.add_argument("--out", help="output folder (default: <results_dir>/export/<run>)")


def main(args) -> int:
    """``protoclip export``; a method open_clip cannot represent is one line and exit 2, no traceback."""
    try:
        print(run_export(args.cfg, args.run, args.out))
    except ExportError as err:
        print(f"protoclip export: cannot export: {err}", file=sys.stderr)
        return 2
    return 0


__all__ = ["CONFIG_FILE", "WEIGHTS_FILE", "ExportError", "export_notes", "export_openclip",
           "export_or_copy",
           "export_refusal",
           "open_clip_model_cfg", "preprocess_cfg", "run_export"]
