"""protoclip-repro: reproducible ProtoCLIP (prototypical contrastive language-image pretraining)."""
import os

# OpenMP threads sleep instead of spin-waiting at barriers: where processes and DataLoader workers share few cores,
# spinning threads wait for descheduled ones (bench/README.md). Read when torch / sklearn load libgomp, so set
# before they are imported; an explicit OMP_WAIT_POLICY in the environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
