"""t-SNE figure: writes a real PNG atomically, subsamples, checks its inputs."""
from __future__ import annotations

import numpy as np
import pytest

from protoclip.evaluate.metrics.embedding_plots import tsne_plot


def test_writes_non_empty_png_and_subsamples(tmp_path):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 90)
    x = np.eye(3, 8)[y] * 4 + rng.normal(size=(90, 8))
    out_png = tmp_path / "figs" / "tsne.png"
    out = tsne_plot(x, y, ["airplane", "cat", "dog"], out_png, max_points=60)
    data = out_png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    assert out["n_points"] == 60 and out["n_classes"] == 3 and out["kl_divergence"] >= 0
    assert [p.name for p in out_png.parent.iterdir()] == ["tsne.png"]  # no temporary file left behind


def test_bad_inputs_leave_no_file(tmp_path):
    x = np.random.default_rng(1).normal(size=(10, 4))
    with pytest.raises(ValueError, match="classnames"):
        tsne_plot(x, np.arange(10) % 3, ["a", "b"], tmp_path / "t.png")
    with pytest.raises(ValueError, match="at least 3"):
        tsne_plot(x[:2], [0, 1], None, tmp_path / "t.png")
    assert not (tmp_path / "t.png").exists()
