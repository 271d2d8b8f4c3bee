"""Episodic trainer for every training method (ProtoCLIP Sec. III-D, IV-A).

    protoclip train --config config/config.yaml --run protoclip_tiny_s0 [--resume]
    torchrun --nproc_per_node 2 -m protoclip.cli train --run protoclip_tiny     # DDP

Modules: ``config`` (TrainConfig), ``schedule`` (episodes, warm-up + cosine LR, locked-image epoch),
``episode`` (sampling, feature extraction), ``methods`` (one module per ``method:``, the loss terms and per-episode work, e.g. prototypes),
``loop`` (the trainer), ``checkpoint`` (exact resume), ``distributed`` (torchrun helpers), ``stage`` (``run_train``, the CLI entry
point). The train log's format (``TrainLog``) lives in ``protoclip.files.records``.
"""
