"""``train_log.jsonl``: one JSON object per line, appended as training goes.

Record kinds: ``start`` (config + provenance, once per (re)start), ``step`` (loss terms, temperatures,
LRs of one optimizer step), ``episode`` (cluster statistics and the time split extract / kmeans / pbt /
train of one episode). On resume the log is cut back to what the checkpoint covers (steps < its global
step, episodes < its episode), atomically, so a resumed run's log equals an uninterrupted run's.

    log = TrainLog(path); log.append({"kind": "step", "step": 0, "loss": 1.2})
    read_log(path, kind="episode")
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from protoclip.atomic import write_text


def _clean(value: Any) -> Any:
    """JSON has no NaN/Inf: write them as strings so the line stays valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    return value


class TrainLog:
    def __init__(self, path: str | Path, enabled: bool = True):
        self.path = Path(path)
        self.enabled = enabled  # False on non-zero DDP ranks

    def append(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(_clean(record), sort_keys=True) + "\n")
            f.flush()

    def truncate_to(self, episode: int, step: int) -> None:
        """Keep only records a checkpoint at (next ``episode``, global ``step``) covers."""
        if not self.enabled or not self.path.exists():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line cut by the kill
                continue
            kind = rec.get("kind")
            if (kind == "step" and rec["step"] >= step) or (kind == "episode" and rec["episode"] >= episode):
                continue
            kept.append(line)
        write_text(self.path, "".join(k + "\n" for k in kept))

    def reset(self) -> None:
        if self.enabled and self.path.exists():
            self.path.unlink()


def read_log(path: str | Path, kind: str | None = None) -> list[dict[str, Any]]:
    """Records of ``train_log.jsonl`` (only those of ``kind`` when given)."""
    out = []
    for line in Path(path).read_text().splitlines():
        rec = json.loads(line)
        if kind is None or rec.get("kind") == kind:
            out.append(rec)
    return out
