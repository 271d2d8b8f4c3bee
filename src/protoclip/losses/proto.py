"""Prototype-level losses of ProtoCLIP [paper Sec. III, Eqs. 3-5, 7, 8]: L_Proto and L_Proto^external of each batch
against the prototypes its episode built once (:class:`protoclip.prototypes.episode.EpisodePrototypes`); the
trainer adds them to L_CLIP [Eq. 9]. The equations, the choices taken from the authors' code where the paper is
silent, and usage: docs/methods.md, "protoclip.losses.proto".
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from protoclip.prototypes.episode import EpisodePrototypes


def check_on_device(ok: torch.Tensor, message: str) -> None:
    """Stop when the 0-d bool ``ok`` is false without a host read in the training step: on CUDA a device-side
    assert (raised at the next synchronisation, the message in it), on the CPU a ValueError at once."""
    try:
        torch._assert_async(ok, message)
    except RuntimeError:
        raise ValueError(message) from None


# --------------------------------------------------------------------------- pure functions
def soft_target_rows(
    prototypes: torch.Tensor,
    labels: torch.Tensor,
    tau_y: float,
    hard: bool = False,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Targets of samples assigned to ``labels`` [B]: softmax(C c_{label} / tau_y) [Eq. 5] -> [B, K].

    ``hard`` gives one-hot rows. ``valid`` [K] bool drops prototypes (exact zeros, rows renormalised).
    Indexed per sample through its teacher assignment [ref-code loss.py ``teacher_centroids[labels] @
    teacher_centroids.T / T``]: computed for the batch's rows, never as a K x K table (1.6 GB at K = 20k).
    """
    if prototypes.ndim != 2:
        raise ValueError(f"soft_targets: prototypes must be [K, d], got {tuple(prototypes.shape)}")
    k = prototypes.shape[0]
    labels = labels.to(prototypes.device).long()
    if labels.numel():
        check_on_device((labels.min() >= 0) & (labels.max() < k), f"soft_targets: labels must lie in [0, {k})")
    if valid is not None and labels.numel():
        check_on_device(valid.to(labels.device)[labels.clamp(0, k - 1)].all(),
                        "soft_targets: a label points at a prototype marked invalid (empty)")
    if hard:
        return F.one_hot(labels, k).to(prototypes.dtype if prototypes.is_floating_point() else torch.float32)
    if tau_y <= 0:
        raise ValueError(f"soft_targets: tau_y must be > 0 for soft targets, got {tau_y} (use hard=True)")
    c = prototypes.float()
    scores = (c[labels] @ c.T) / float(tau_y)
    if valid is not None:
        scores = scores.masked_fill(~valid.to(scores.device)[None, :], float("-inf"))
    return scores.softmax(dim=1)


def proto_ce(
    h: torch.Tensor,
    classifier: torch.Tensor,
    targets: torch.Tensor,
    logit_scale: torch.Tensor | float,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Cross-entropy of prototype-classifier probabilities against targets [Eqs. 3-4], mean over the B samples.

    h [B, d] (used as given), classifier [K, d], targets [B, K] (rows sum to 1), logit_scale = 1/tau_Proto
    (exponentiated). ``valid`` [K] bool keeps only those prototypes (columns) in the softmax. Mean over the
    samples where Eq. 4 writes a sum: a constant factor that the authors' ``nn.CrossEntropyLoss`` also replaces
    by the mean. The classifier is used raw, not re-normalised [ref-code loss.py
    ``student_features @ student_centroids.T``].
    """
    if h.ndim != 2 or classifier.ndim != 2 or h.shape[1] != classifier.shape[1]:
        raise ValueError(f"proto_ce: need h [B, d] and classifier [K, d], got {tuple(h.shape)}, {tuple(classifier.shape)}")
    if targets.shape != (h.shape[0], classifier.shape[0]):
        raise ValueError(f"proto_ce: targets must be {(h.shape[0], classifier.shape[0])}, got {tuple(targets.shape)}")
    classifier = classifier.to(h.device)
    targets = targets.to(h.device)
    if valid is not None:
        valid = valid.to(h.device)
        classifier, targets = classifier[valid], targets[:, valid]
    # fp32 logits even under autocast: K can be 20k and soft targets need the full precision softmax.
    with torch.autocast(device_type=h.device.type, enabled=False):
        logits = logit_scale * (h.float() @ classifier.float().T)
        return -(targets.float() * logits.log_softmax(dim=1)).sum(dim=1).mean()


@torch.no_grad()
def proto_accuracy(h: torch.Tensor, classifier: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """% of samples whose top prototype is their assigned one (the ref code's ``acc_img2text`` diagnostic); a 0-d
    tensor on the device."""
    scores = h.float() @ classifier.to(h.device).float().T
    if valid is not None:
        scores = scores.masked_fill(~valid.to(h.device)[None, :], float("-inf"))
    return (scores.argmax(dim=1) == labels.to(h.device)).float().mean() * 100.0


# --------------------------------------------------------------------------- per-batch loss
class ProtoLoss(nn.Module):
    """L_Proto [Eq. 4] and L_Proto^external [Eq. 8] of a batch against an episode's prototypes.

    ``forward(h_image, h_text, positions, episode, proto_logit_scale)``: h [B, d_h] of the batch (fresh
    augmentations), ``positions`` [B] long = each sample's row in the episode, ``episode`` the episode's
    :class:`~protoclip.prototypes.episode.EpisodePrototypes`, ``proto_logit_scale`` = 1/tau_Proto (``model.proto_logit_scale.exp()``). Returns {"proto",
    "proto_external"} (the latter a constant 0 without a teacher); detached diagnostics (per-direction losses,
    prototype accuracies in %) are left in ``self.last_stats``. h is L2-normalised again here (idempotent);
    the external term takes hard targets through PBT centroids, and prototypes left empty under PBT are
    dropped (not the ref code's zero rows): docs/methods.md, "protoclip.losses.proto".
    """

    def __init__(self):
        super().__init__()
        self.last_stats: dict[str, torch.Tensor] = {}

    def forward(
        self,
        h_image: torch.Tensor,
        h_text: torch.Tensor,
        positions: torch.Tensor,
        ep: EpisodePrototypes,
        proto_logit_scale: torch.Tensor | float,
    ) -> dict[str, torch.Tensor]:
        if h_image.ndim != 2 or h_image.shape != h_text.shape:
            raise ValueError(f"ProtoLoss: h_image and h_text must both be [B, d], got {tuple(h_image.shape)}, {tuple(h_text.shape)}")
        pos = torch.as_tensor(positions, device=ep.device).long()
        if pos.shape != (h_image.shape[0],):
            raise ValueError(f"ProtoLoss: positions must be [B={h_image.shape[0]}], got {tuple(pos.shape)}")
        check_on_device((pos.min() >= 0) & (pos.max() < ep.n_samples),
                        f"ProtoLoss: positions must lie in [0, {ep.n_samples}) (rows of the episode)")
        h_i, h_t = F.normalize(h_image, dim=1), F.normalize(h_text, dim=1)
        hard = not ep.soft_targets

        # image student, text teacher [Eqs. 3-5]; text student, image teacher
        a_t = ep.text.assignments.to(ep.device)[pos]
        a_i = ep.image.assignments.to(ep.device)[pos]
        y_t = soft_target_rows(ep.text.centroids.to(ep.device), a_t, ep.tau_y, hard=hard, valid=ep.valid_image)
        y_i = soft_target_rows(ep.image.centroids.to(ep.device), a_i, ep.tau_y, hard=hard, valid=ep.valid_text)
        l_i2t = proto_ce(h_i, ep.cls_image, y_t, proto_logit_scale, ep.valid_image)
        l_t2i = proto_ce(h_t, ep.cls_text, y_i, proto_logit_scale, ep.valid_text)
        terms = {"proto": 0.5 * (l_i2t + l_t2i)}
        stats = {
            "proto_i2t": l_i2t.detach(), "proto_t2i": l_t2i.detach(),
            "acc_i2t": proto_accuracy(h_i.detach(), ep.cls_image, a_t, ep.valid_image),
            "acc_t2i": proto_accuracy(h_t.detach(), ep.cls_text, a_i, ep.valid_text),
        }

        if ep.external is not None:  # [Eq. 8], hard targets through PBT centroids
            a_e = ep.external.assignments.to(ep.device)[pos]
            y_e = F.one_hot(a_e, ep.cls_image_ext.shape[0]).float()
            l_i2e = proto_ce(h_i, ep.cls_image_ext, y_e, proto_logit_scale, ep.valid_image_ext)
            l_t2e = proto_ce(h_t, ep.cls_text_ext, y_e, proto_logit_scale, ep.valid_text_ext)
            terms["proto_external"] = 0.5 * (l_i2e + l_t2e)
            stats.update({
                "proto_i2ext": l_i2e.detach(), "proto_t2ext": l_t2e.detach(),
                "acc_i2ext": proto_accuracy(h_i.detach(), ep.cls_image_ext, a_e, ep.valid_image_ext),
                "acc_t2ext": proto_accuracy(h_t.detach(), ep.cls_text_ext, a_e, ep.valid_text_ext),
            })
        else:
            terms["proto_external"] = torch.zeros((), device=h_image.device)
        self.last_stats = stats
        return terms


__all__ = ["soft_target_rows", "proto_ce", "proto_accuracy", "ProtoLoss"]
