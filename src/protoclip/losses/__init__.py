"""ProtoCLIP losses: L_CLIP [Eq. 1] and the prototype terms L_Proto [Eqs. 3-5, 7] / L_Proto^external [Eq. 8].

Each returns a dict of named terms; the trainer forms the total [Eq. 9] as a weighted sum.
"""
from protoclip.losses.clip import clamp_logit_scale_, clip_loss
from protoclip.losses.proto import (
    EpisodePrototypes,
    ProtoLoss,
    pbt_centroids,
    proto_accuracy,
    proto_ce,
    soft_target_rows,
)

__all__ = [
    "clip_loss", "clamp_logit_scale_", "soft_target_rows", "pbt_centroids", "proto_ce",
    "proto_accuracy", "EpisodePrototypes", "ProtoLoss",
]
