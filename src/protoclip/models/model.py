"""ProtoCLIP model: an open_clip CLIP encoder pair plus the projection heads g^I, g^T (ProtoCLIP Sec. III-A, Fig. 3).

Every method's model is this one nn.Module with its own heads (SwAV-style, nCLIP's, PCL's). Build one with
:func:`protoclip.models.build_model`; this module holds only the nn.Modules.
"""
from __future__ import annotations

import math

from open_clip.model import CLIP
from open_clip.transformer import text_global_pool
import torch
from torch import nn

IMAGE_PREFIX = "clip.visual."  # parameters of the image encoder f^I (zeroed LR under locked-image tuning)


class ProjectionHead(nn.Sequential):
    """g: Linear(d_z, hidden) -> BatchNorm1d(hidden) -> ReLU -> Linear(hidden, d_h).

    The paper says "the same architecture as SwAV: a 2-layer MLP with ReLU, 2048 hidden, 128 out" (Sec. IV-A1).
    SwAV's head and the official ProtoCLIP code (megvii-research/protoclip, ``src/open_clip/model.py``,
    ``projection_n_layers=1``) both put a BatchNorm1d after the first Linear, so we do too. ``hidden=0`` gives a
    single Linear layer (the official ``projection_n_layers=0`` variant). Outputs are unnormalised.

    Unlike the official code, which deep-copies the text head to make the image head (so both start with
    identical weights), the two heads here are initialised independently: they read different input spaces,
    so a shared initialisation has no meaning, and the paper does not mention one.

    BatchNorm needs more than one sample per batch in train mode; call ``model.eval()`` for inference.
    """

    def __init__(self, in_dim: int, hidden: int = 2048, out_dim: int = 128):
        if in_dim < 1 or out_dim < 1 or hidden < 0:
            raise ValueError(f"projection head sizes must be positive, got in={in_dim} hidden={hidden} out={out_dim}")
        if hidden == 0:
            layers: list[nn.Module] = [nn.Linear(in_dim, out_dim)]
        else:
            layers = [nn.Linear(in_dim, hidden), nn.BatchNorm1d(hidden), nn.ReLU(inplace=True), nn.Linear(hidden, out_dim)]
        super().__init__(*layers)
        self.in_dim, self.hidden, self.out_dim = in_dim, hidden, out_dim


class NCLIPHead(nn.Sequential):
    """nCLIP head (nclip-xclip.txt Sec. 3.1, Table 14 "4096-32768"; methods-spec 1.3):
    Linear(d_z, hidden) -> BatchNorm1d(hidden) -> GELU -> Linear(hidden, K) -> BatchNorm1d(K, affine=False).

    The paper lists "GELU and BatchNorm" without an order; we use the spec's Linear -> BN -> GELU order. The
    final non-affine BatchNorm fixes the logits' scale (nCLIP's softmax has no temperature); the K output units
    are the implicit clusters. ``hidden=0`` drops the hidden layer (tiny ablations)."""

    def __init__(self, in_dim: int, hidden: int = 4096, out_dim: int = 32768):
        if in_dim < 1 or out_dim < 2 or hidden < 0:
            raise ValueError(f"nCLIP head sizes: in >= 1, hidden >= 0, out >= 2, got {in_dim}/{hidden}/{out_dim}")
        layers: list[nn.Module] = []
        if hidden:
            layers += [nn.Linear(in_dim, hidden), nn.BatchNorm1d(hidden), nn.GELU()]
        layers += [nn.Linear(hidden or in_dim, out_dim), nn.BatchNorm1d(out_dim, affine=False)]
        super().__init__(*layers)
        self.in_dim, self.hidden, self.out_dim = in_dim, hidden, out_dim


class MoCoHead(nn.Sequential):
    """PCL's image head in place of ResNet's fc: ``hidden=0`` -> Linear(d_z, out) (PCL v1 / MoCo v1: "the last
    fully-connected layer outputs a 128-D ... feature", pcl-protonce.txt l.150, pauc-nemd.txt l.156); else MoCo v2's
    MLP head Linear(d_z, hidden) -> ReLU -> Linear(hidden, out) (PCL v2's "MLP projection layer", l.150; MoCo v2's
    code: ``nn.Sequential(nn.Linear(dim_mlp, dim_mlp), nn.ReLU(), fc)``, no BatchNorm, hidden = d_z = 2048)."""

    def __init__(self, in_dim: int, hidden: int = 2048, out_dim: int = 128):
        if in_dim < 1 or out_dim < 1 or hidden < 0:
            raise ValueError(f"MoCo head sizes must be positive, got in={in_dim} hidden={hidden} out={out_dim}")
        layers: list[nn.Module] = [nn.Linear(in_dim, hidden), nn.ReLU(inplace=True)] if hidden else []
        super().__init__(*layers, nn.Linear(hidden or in_dim, out_dim))
        self.in_dim, self.hidden, self.out_dim = in_dim, hidden, out_dim


# the second head's architectures by name: a training method picks one (``Method.head``), model.pt records the
# name and load_model rebuilds from it without knowing the method
HEADS = {"swav": ProjectionHead, "nclip": NCLIPHead, "moco": MoCoHead}


# ---- text tower on the batch's own length (CPU speed, exact)
# open_clip's CLIP.encode_text runs all `context_length` positions, padding included. Its text transformer is
# causal and pools at the EOT token (`text_pool_type == "argmax"`: EOT has the highest id), so the pooled feature
# depends only on the positions up to EOT: running the first L = (last EOT position in the batch) + 1 positions
# gives the same z^T and the same gradients (the cut positions never reach the output). We do this on CPU only:
# there the offline captions' batches need ~26 of 32 positions (median over batches of 128), the text tower is
# most of a tiny model's step, and reading L costs nothing; on a GPU it would cost a host sync per step.
# tests/unit/test_models.py checks values and gradients against open_clip's own encode_text.
def trims_text(clip: nn.Module) -> bool:
    """Whether ``clip`` is open_clip's plain CLIP with a causal, EOT-pooled text tower (trimming is exact)."""
    return (type(clip) is CLIP and getattr(clip, "text_pool_type", None) == "argmax"
            and getattr(clip, "attn_mask", None) is not None)


def encode_text_trimmed(clip: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """open_clip ``CLIP.encode_text(tokens, normalize=False)`` (3.3.0, model.py) on the first L positions only."""
    n = int(tokens.argmax(dim=-1).max()) + 1  # EOT position of the longest caption, + 1
    text = tokens[:, :n]
    cast_dtype = clip.transformer.get_cast_dtype()
    x = clip.token_embedding(text).to(cast_dtype) + clip.positional_embedding[:n].to(cast_dtype)
    x = clip.transformer(x, attn_mask=clip.attn_mask[:n, :n])
    x = clip.ln_final(x)
    x = text_global_pool(x, text, clip.text_pool_type, eos_token_id=getattr(clip, "text_eos_id", None))
    if clip.text_projection is not None:
        x = clip.text_projection(x) if isinstance(clip.text_projection, nn.Linear) else x @ clip.text_projection
    return x


class ProtoCLIPModel(nn.Module):
    """open_clip CLIP (``.clip``) + heads ``.image_head`` (g^I) and ``.text_head`` (g^T) + two temperatures.

    ``head``: ``swav`` (ProtoCLIP's g, :class:`ProjectionHead`), ``nclip`` (:class:`NCLIPHead`, nCLIP/xCLIP:
    h are then the K-way logits) or ``moco`` (:class:`MoCoHead`, PCL's fc / MLP). ``.clip`` may be a
    multi-class-token CLIP (:mod:`protoclip.models.multitoken`),
    whose z are the m per-token projections concatenated ([B, m * n]), or an image-only torchvision tower
    (:mod:`protoclip.models.torchvision_image`, ``has_text`` False: no text head, ``text_head`` is None).

        z^I = f^I(x^I), z^T = f^T(x^T)          open_clip encoders (unnormalised; L_CLIP normalises them)
        h^I = g^I(z^I), h^T = g^T(z^T)          projection heads; prototypes live in h-space

    The temperatures are stored as log(1/tau), CLIP's convention: ``logit_scale`` (tau_CLIP) is the open_clip
    model's own parameter, ``proto_logit_scale`` (tau_Proto) is added here; both start at log(1/0.07) (Table I).
    Clipping 1/tau at 100 is the trainer's job."""

    def __init__(
        self,
        clip: nn.Module,
        *,
        name: str,
        embed_dim: int,
        image_size: int,
        head_hidden: int = 2048,
        head_out: int = 128,
        init_temperature: float = 0.07,
        head: str = "swav",
    ):
        super().__init__()
        if not 0 < init_temperature:
            raise ValueError(f"init_temperature must be > 0, got {init_temperature}")
        self.clip = clip
        self.name = name
        self.embed_dim = int(embed_dim)
        self.image_size = int(image_size)
        self.context_length = int(clip.context_length)
        self.head_hidden, self.head_out = int(head_hidden), int(head_out)
        if head not in HEADS:
            raise ValueError(f"unknown head {head!r} (known: {', '.join(HEADS)})")
        self.head = head
        self.image_head = HEADS[head](self.embed_dim, head_hidden, head_out)
        self.text_head = HEADS[head](self.embed_dim, head_hidden, head_out) if getattr(clip, "has_text", True) \
            else None
        init = math.log(1.0 / init_temperature)
        with torch.no_grad():
            self.clip.logit_scale.fill_(init)
        self.proto_logit_scale = nn.Parameter(torch.tensor(init, dtype=torch.float32))

    # tau_CLIP is open_clip's own parameter (one copy, so open_clip utilities keep working on .clip)
    @property
    def logit_scale(self) -> nn.Parameter:
        return self.clip.logit_scale

    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        """z^I [B, embed_dim], not normalised."""
        return self.clip.encode_image(images, normalize=False)

    def encode_text(self, tokens: torch.Tensor) -> torch.Tensor:
        """z^T [B, embed_dim], not normalised."""
        if tokens.dim() != 2 or tokens.shape[1] != self.context_length:
            raise ValueError(f"tokens must be [B, {self.context_length}] for model '{self.name}', got {list(tokens.shape)}")
        if tokens.device.type == "cpu" and trims_text(self.clip):
            return encode_text_trimmed(self.clip, tokens)
        return self.clip.encode_text(tokens, normalize=False)

    def forward(self, images: torch.Tensor | None = None, tokens: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Return ``z_image, z_text, h_image, h_text`` (all unnormalised).

        Either input may be None (e.g. the episode feature pass over images only); its keys are then absent.
        """
        if images is None and tokens is None:
            raise ValueError("forward needs images, tokens or both")
        out: dict[str, torch.Tensor] = {}
        if images is not None:
            out["z_image"] = self.encode_image(images)
            out["h_image"] = self.image_head(out["z_image"])
        if tokens is not None:
            out["z_text"] = self.encode_text(tokens)
            out["h_text"] = self.text_head(out["z_text"])
        return out

    def param_groups(self, weight_decay: float, head_weight_decay: bool = False) -> list[dict]:
        """AdamW parameter groups: image_decay, image_no_decay, other_decay, other_no_decay (always all four).

        * no decay: every parameter with fewer than 2 dims -- temperatures (0-d), biases, BatchNorm/LayerNorm
          gains and the ViT class embedding. This is open_clip's ``exclude`` rule (``p.ndim < 2 or 'bn'/'ln'/
          'bias'/'logit_scale' in name``): for these models the name tests add nothing the ndim test misses.
        * the projection heads get no weight decay by default, as in the official code (``'projection_head'``
          is in its ``exclude``); ``head_weight_decay=True`` puts their weight matrices in ``other_decay``.
        * ``image_*`` holds the image encoder f^I (``clip.visual.*``), the part whose LR goes to zero under
          locked-image tuning. The image head g^I is in ``other_*`` (the official code's ``'visual' in name``
          split leaves ``image_projection_head`` with the text side).

        Each group has ``name``, ``params``, ``param_names`` and ``weight_decay``; frozen parameters are skipped.
        """
        groups = {k: {"name": k, "params": [], "param_names": []} for k in
                  ("image_decay", "image_no_decay", "other_decay", "other_no_decay")}
        for n, p in self.named_parameters():
            if not p.requires_grad:
                continue
            side = "image" if n.startswith(IMAGE_PREFIX) else "other"
            is_head = n.startswith(("image_head.", "text_head."))
            decay = p.ndim >= 2 and (head_weight_decay or not is_head)
            key = f"{side}_{'decay' if decay else 'no_decay'}"
            groups[key]["params"].append(p)
            groups[key]["param_names"].append(n)
        for key, g in groups.items():
            g["weight_decay"] = 0.0 if key.endswith("no_decay") else float(weight_decay)
        return list(groups.values())
