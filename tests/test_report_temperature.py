"""The temperature figure reads the trainer's step lines (clip_scale, equilibrium, grad_norm)."""
from __future__ import annotations

import json

from protoclip.report.temperature import plot_temperature, temperature_curves


def _log(path, scales):
    lines = [{"kind": "start", "episode": 0, "step": 0}]
    lines += [{"kind": "step", "step": i, "clip_scale": s, "equilibrium": 0.1 / (i + 1), "grad_norm": 1.0 + i}
              for i, s in enumerate(scales)]
    lines.append({"kind": "episode", "episode": 0, "step": len(scales), "mean/clip_scale": 1.0})
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def test_curves_and_figure(tmp_path):
    logs = {"a": _log(tmp_path / "a.jsonl", [14.3, 15.0, 16.2]), "b": _log(tmp_path / "b.jsonl", [1.0, 1.1]),
            "nclip": tmp_path / "missing.jsonl"}
    c = temperature_curves(logs)
    assert set(c) == {"a", "b"} and c["a"]["clip_scale"] == [14.3, 15.0, 16.2] and c["b"]["step"] == [0, 1]
    out = tmp_path / "fig" / "temperature.png"
    assert plot_temperature(logs, out) and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not plot_temperature({"x": tmp_path / "missing.jsonl"}, tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()
