"""The MLflow UI as a person sees it: ``mlflow server`` on a store, on a free loopback port, stopped after, and
headless Chromium rendering its pages (the DOM after the UI's scripts ran, and a screenshot).

    with MlflowUI(cfg.paths.mlflow_uri) as ui:
        dom = ui.render("#/models/clip", out_png)   # the rendered page's HTML, and its screenshot
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from testkit.services import Service
from testkit.training import free_port

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
NO_CHROMIUM = "chromium not installed (Debian: apt-get install -y chromium): the MLflow UI was not opened"


def chromium(args: list[str], window: str = "1600,900", budget_ms: int = 15000) -> subprocess.CompletedProcess:
    """Headless Chromium with ``args`` (``--dump-dom URL``, ``--screenshot=PNG URL``, or both); the UI's scripts
    get ``budget_ms`` of virtual time to render. Every compositor stage runs before a frame is drawn: without it the
    UI's charts (drawn when they scroll into view) stay spinners in a headless window."""
    profile = tempfile.mkdtemp(prefix="chromium-")  # a fresh profile: no state of an earlier page
    base = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={profile}", "--run-all-compositor-stages-before-draw",
            f"--virtual-time-budget={budget_ms}", f"--window-size={window}"]
    try:
        return subprocess.run(base + args, capture_output=True, text=True, timeout=300, check=False)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def serve_ui(uri: str, port: int) -> subprocess.Popen:
    """``mlflow server`` on store ``uri`` at 127.0.0.1:``port``, once it answers /health."""
    mlflow_bin = Path(sys.executable).with_name("mlflow")
    proc = subprocess.Popen([str(mlflow_bin), "server", "--backend-store-uri", uri,
                             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200:
                return proc
        except OSError:
            time.sleep(1)
    proc.terminate()
    proc.wait(timeout=30)
    raise AssertionError("mlflow server did not answer /health within 120 s")


class MlflowUI(Service):
    """``mlflow server`` on ``uri`` for the block; :meth:`dom` and :meth:`screenshot` of its pages."""

    def __init__(self, uri: str):
        self.uri, self.proc, self.port = uri, None, free_port()

    def start(self) -> MlflowUI:
        self.proc = serve_ui(self.uri, self.port)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
            self.proc = None

    def url(self, fragment: str = "") -> str:
        return f"http://127.0.0.1:{self.port}/{fragment}"

    def render(self, fragment: str, out: Path, **kw) -> str:
        """Screenshot page ``fragment`` to ``out`` (PNG); returns its DOM, from the same page load."""
        return chromium([f"--screenshot={out}", "--dump-dom", self.url(fragment)], **kw).stdout
