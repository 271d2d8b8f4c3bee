"""Episodic trainer for every training method (ProtoCLIP Sec. III-D, IV-A), run as
``protoclip train --config config/config.yaml --run protoclip_tiny_s0 [--resume]`` (DDP:
``torchrun --nproc_per_node 2 -m protoclip.cli train --run protoclip_tiny``). Its modules:
docs/methods.md, "protoclip.train"; the train log's format (``TrainLog``) lives in ``protoclip.files.records``.
"""
