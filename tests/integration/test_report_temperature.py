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


def test_figure_with_diagnostics_panels(tmp_path):
    """The diagnostics of evaluate.metrics.temperature (Fig. 1 sweep, Fig. 8 histograms, Table 11) add panels."""
    import numpy as np

    from protoclip.evaluate.metrics.temperature import distance_histograms, equilibrium_sweep, token_subset_zeroshot

    rng = np.random.default_rng(0)
    z = rng.normal(size=(80, 8))
    u, v = z + 0.3 * rng.normal(size=z.shape), z + 0.3 * rng.normal(size=z.shape)
    u, v = u / np.linalg.norm(u, axis=1, keepdims=True), v / np.linalg.norm(v, axis=1, keepdims=True)
    diag = {**equilibrium_sweep(u, v, np.geomspace(0.1, 100, 9), [16, 64], [0.0, 0.1]),
            "histograms": distance_histograms(u, v, bins=10)}
    multi = {**diag, "token_subsets": token_subset_zeroshot(u, v[:4], rng.integers(0, 4, 80), 4, (1, 2))}
    logs = {"a": _log(tmp_path / "a.jsonl", [14.3, 15.0]), "b": _log(tmp_path / "b.jsonl", [1.0, 1.1])}
    plain, full = tmp_path / "plain.png", tmp_path / "full.png"
    assert plot_temperature(logs, plain) and plot_temperature(logs, full, {"a": diag, "b": multi, "c": None})
    from PIL import Image

    # 3 more panels (Fig. 1 x2, tau*), the token panel and 2 histograms: two more rows of the 3-column grid
    assert Image.open(full).size[1] == 3 * Image.open(plain).size[1]


def test_diagnostics_read_from_the_targets_columns(tmp_path):
    from types import SimpleNamespace

    from protoclip.report.paper_targets import ColumnConfig, RowConfig, TargetConfig
    from protoclip.report.temperature import temperature_diagnostics

    target = TargetConfig("fig_t", "figure", "c", plot="temperature",
                          rows=[RowConfig("sphere", "r1"), RowConfig("multi", "r2"), RowConfig("paper only")],
                          columns=[ColumnConfig("pairs", "temperature", "n_pairs", ["coco"], ["heldout_pairs"]),
                                   ColumnConfig("tokens", "temperature", "tokens", ["imagenet"], ["digits"])])
    stored = {("r1", "heldout_pairs"): {"n_pairs": 5, "sweep": []}, ("r2", "heldout_pairs"): {"n_pairs": 5},
              ("r2", "digits"): {"tokens": 4, "token_subsets": {"tokens": 4}}}
    results = SimpleNamespace(
        metrics=lambda run, task, d: stored.get((run, d)) if task == "temperature" else None,
        column_sets=lambda t, c: (c.offline, "note"))
    cfg = SimpleNamespace(run_group=lambda base: [f"{base}"] if base in ("r1", "r2") else [])
    got = temperature_diagnostics(cfg, results, target)
    assert got == {"sphere (r1)": {"n_pairs": 5, "sweep": []},
                   "multi (r2)": {"n_pairs": 5, "tokens": 4, "token_subsets": {"tokens": 4}}}
