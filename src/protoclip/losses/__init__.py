"""ProtoCLIP losses: L_CLIP [Eq. 1] and the prototype terms L_Proto [Eqs. 3-5] / L_Proto^external [Eq. 8].

Each returns a dict of named terms; the trainer forms the total [Eq. 9] as a weighted sum. The prototypes they
read (k-means, PBT [Eq. 7]) are built once per episode by :mod:`protoclip.prototypes.episode`.
"""
from protoclip.losses.clip import clamp_logit_scale_, clip_loss
from protoclip.losses.proto import ProtoLoss, proto_accuracy, proto_ce, soft_target_rows

__all__ = ["clip_loss", "clamp_logit_scale_", "soft_target_rows", "proto_ce", "proto_accuracy", "ProtoLoss"]
