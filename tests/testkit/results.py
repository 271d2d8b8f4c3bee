"""Results trees written by the tests."""
from __future__ import annotations

from pathlib import Path


def mark_evaluated(results_dir: Path) -> None:
    """Vouch for every metrics file (and per-example file) of every evaluation folder under ``results_dir``, as
    `evaluate` does last."""
    from protoclip.completion import finish

    for folder in sorted(Path(results_dir).glob("runs/*/eval/*/")):
        files = [p for p in folder.glob("*.json") if p.name != "tasks.json"] + list(folder.glob("*.examples.npz"))
        finish(folder / "tasks.json", {"tasks": {p.stem: "ran" for p in files if p.suffix == ".json"}}, files)
