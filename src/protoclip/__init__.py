"""protoclip-repro: reproducible ProtoCLIP (prototypical contrastive language-image pretraining)."""
import os

# OpenMP threads sleep instead of spin-waiting at barriers (read when torch / sklearn load libgomp, so set
# before they are imported; an explicit OMP_WAIT_POLICY in the environment wins). On the shared 2-core CPU
# machine, where several processes and DataLoader workers compete for the cores, spinning threads wait for
# descheduled ones: a tiny-rn training step (batch 32, 2 threads) took 36.8 s with the default policy and
# 4.1 s with PASSIVE in the same minute (bench/README.md).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
