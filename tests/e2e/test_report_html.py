"""`snakemake --report`: one HTML page with every paper table and figure, checked in a real browser.

Runs the workflow's report rule (workflow/rules/report.smk, through a minimal Snakefile that includes only
common.smk and report.smk) on synthetic results of the shipped offline config, builds the Snakemake report,
and renders it with headless Chromium (Debian package ``chromium``; skipped with the reason when it is not
installed). The DOM after JavaScript ran must list every target with its caption. Manual check of the
screenshot: ``python tests/test_report_html.py OUT_DIR`` writes OUT_DIR/report.html and OUT_DIR/report.png.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.reports import ALL_TARGETS, ROOT, project_copy, synthesize

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SNAKEMAKE = shutil.which("snakemake")


def chromium(args: list[str], timeout: int = 120) -> subprocess.CompletedProcess:
    base = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-dev-shm-usage", "--no-first-run", "--virtual-time-budget=10000"]
    return subprocess.run(base + args, capture_output=True, text=True, timeout=timeout)


def with_script(html: Path, js: str, out_dir: Path) -> Path:
    """A copy of the report that runs ``js`` once the app has started (what a click would do)."""
    head, tail = html.read_text().rsplit("</body>", 1)
    out = out_dir / f"view_{abs(hash(js))}.html"
    out.write_text(head + f"<script>setTimeout(() => {{ {js} }}, 300);</script></body>" + tail)
    return out


def build_report(tmp_path: Path) -> Path:
    """Synthetic results -> `snakemake` (report rule only) -> `snakemake --report`; returns report.html."""
    import json

    from protoclip.project import load_config
    from protoclip.files.layout import Layout
    from protoclip.report.values import Results

    cfg_file = project_copy(tmp_path)
    cfg = load_config(cfg_file)
    synthesize(cfg, examples=True)  # per-example results: the claims ledger and difference rows get intervals
    layout = Layout.from_config(cfg)
    for i, run in enumerate(cfg.run_names()):  # the report rule's inputs: every run's metrics summary
        if not layout.metrics_summary(run).exists():  # a run with no evaluation: an empty one, as `collect` writes
            layout.metrics_summary(run).parent.mkdir(parents=True, exist_ok=True)
            layout.metrics_summary(run).write_text(json.dumps({}))
        log = layout.train_log(run)  # and training losses to draw (the train_curves figure)
        steps = [{"kind": "step", "step": s, "loss": 2.0 + (3 + i % 5) * 0.9 ** s} for s in range(30)]
        log.write_text(log.read_text() + "".join(json.dumps(r) + "\n" for r in steps))
    assert Results(cfg).skipped()
    rules = ROOT / "workflow" / "rules"
    (tmp_path / "Snakefile").write_text(
        'configfile: "config/config.yaml"\n'
        f'include: "{rules / "common.smk"}"\n'
        f'include: "{rules / "report.smk"}"\n'
        "rule all:\n    input: rules.report.output\n    default_target: True\n")
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYTHONPATH": str(ROOT / "src"),
           "HOME": str(tmp_path), "MPLBACKEND": "Agg"}
    run = subprocess.run([SNAKEMAKE, "--cores", "1", "--quiet"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    html = tmp_path / "results" / "report.html"
    rep = subprocess.run([SNAKEMAKE, "--report", str(html)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert rep.returncode == 0 and html.exists(), rep.stdout[-3000:] + rep.stderr[-3000:]
    return html


@pytest.mark.skipif(SNAKEMAKE is None, reason="snakemake is not on PATH")
def test_snakemake_report_has_every_target_and_renders_in_chromium(tmp_path):
    html = build_report(tmp_path)
    text = html.read_text(errors="replace")
    assert len(text) > 10_000
    if CHROMIUM is None:
        pytest.skip("chromium not installed (Debian: apt-get install -y chromium): the HTML was built but not "
                    "rendered")
    for category, kind in (("Tables", "table"), ("Figures", "fig")):
        # open the category as its menu entry does (app.showCategory), then read the rendered page without
        # scripts: the entries the browser drew, labelled by target id
        dom = chromium(["--dump-dom", with_script(html, f"app.showCategory({category!r})", tmp_path).as_uri()])
        assert dom.returncode == 0, dom.stderr[-2000:]
        drawn = re.sub(r"<script.*?</script>", "", dom.stdout, flags=re.S)
        for target in ALL_TARGETS:
            if target.startswith(kind):
                assert re.search(rf">{target}<", drawn), (category, target)
        if category == "Figures":  # the summary figures (protoclip.report.summary_figures) beside the paper's
            for name in ("ours_vs_paper", "table_VI_differences", "train_curves"):
                assert re.search(rf">{name}<", drawn), (category, name)
    # a table opened as its eye button does: the paper's numbers beside ours, rendered
    js = ("const k = Object.keys(results).find(p => p.endsWith('table_V.html')); app.showResultInfo(k); "
          "app.setView({content: 'html', contentPath: results[k].data_uri});")
    page = with_script(html, js, tmp_path)
    assert "Paper numbers: ProtoCLIP Table V" in text  # the caption is embedded
    shot = tmp_path / "table_V.png"
    r = chromium([f"--screenshot={shot}", "--window-size=1600,1000", page.as_uri()])
    assert r.returncode == 0 and shot.exists() and shot.stat().st_size > 5000
    shot = tmp_path / "report.png"
    r = chromium([f"--screenshot={shot}", "--window-size=1400,1000", html.as_uri()])
    assert r.returncode == 0 and shot.exists() and shot.stat().st_size > 5000
    # the claims ledger: its own category with the ledger table and the forest plot, drawn by the browser
    dom = chromium(["--dump-dom", with_script(html, "app.showCategory('Claims')", tmp_path).as_uri()])
    drawn = re.sub(r"<script.*?</script>", "", dom.stdout, flags=re.S)
    assert ">claims ledger<" in drawn and ">claims forest plot<" in drawn, drawn[-3000:]
    assert "direction" in text and "magnitude" in text  # the two questions' rules in the caption
    for name, kind in (("claims.html", "html"), ("claims.png", "img")):
        shot = tmp_path / f"{name}.png"
        r = chromium([f"--screenshot={shot}", "--window-size=1600,1000", with_script(html, view(name, kind),
                                                                                    tmp_path).as_uri()])
        assert r.returncode == 0 and shot.stat().st_size > 5000, name


def view(name: str, kind: str) -> str:
    """JavaScript that opens one result of the report as its eye button does (``kind``: html | img)."""
    return (f"const k = Object.keys(results).find(p => p.endsWith({name!r})); app.showResultInfo(k); "
            f"app.setView({{content: {kind!r}, contentPath: results[k].data_uri}});")


if __name__ == "__main__":  # manual check: build the report and a screenshot to look at
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "report_check").resolve()
    out.mkdir(parents=True, exist_ok=True)
    page = build_report(out)
    if CHROMIUM:
        chromium([f"--screenshot={out / 'report.png'}", "--window-size=1400,1000", page.as_uri()])
        for name, kind in (("table_V.html", "html"), ("fig_8.png", "img"), ("claims.html", "html"),
                           ("claims.png", "img"), ("ours_vs_paper.png", "img"), ("table_VI_differences.png", "img"),
                           ("train_curves.png", "img")):
            chromium([f"--screenshot={out / (name + '.png')}", "--window-size=1600,1000",
                      with_script(page, view(name, kind), out).as_uri()])
    print(page, *sorted(out.glob("*.png")), sep="\n")
