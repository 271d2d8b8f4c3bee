"""MLflow at cluster scale: jobs logging at once lose nothing, on the SQLite default of one machine and
on a real tracking server (Debian's PostgreSQL + ``mlflow server`` with MLflow's basic-auth, started on loopback
in a temp folder by tests/testkit/tracking_server.py), and a server with authentication refuses whoever has no
credentials.

Each "job" is a process of its own that logs through the project's code path (``protoclip.tracking.
training_run`` and its Tracker: params, per-step metrics, an artifact, the target tags), as the train stage
does; 16 of them start at once against a new store, so they also race to create the experiment. Everything is
read back through ``MlflowClient``: every run, param, metric value and artifact, and the runs-table filter of one
paper table (``tags.`protoclip.target.table_V` = '1'``), also in the MLflow UI of the server (headless
Chromium, skipped with the reason when it is not installed).

Manual look: ``PYTHONPATH=tests python tests/e2e/test_tracking_server.py OUT_DIR`` starts the server, logs the jobs and writes
OUT_DIR/mlflow_server_table_V.png.
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from testkit import REPO, tracking_server

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
N_JOBS, N_STEPS = 16, 40
TABLE_FILTER = "tags.`protoclip.target.table_V` = '1'"  # the README's filter

JOB = """
import sys
from pathlib import Path
from protoclip.project import load_config
from protoclip.tracking import training_run

cfg, i = load_config(sys.argv[1]), int(sys.argv[2])
artifact = Path(sys.argv[3]) / f"notes_{i:02d}.txt"
artifact.write_text(f"job {i}\\n")
with training_run(cfg.paths, f"job{i:02d}", None, ["table_V"] if i % 2 == 0 else ["fig_x"]) as tracker:
    tracker.log_params({"train": {"lr": 0.001 * (i + 1), "seed": i}, "world": {"world_size": 1}})
    for step in range(int(sys.argv[4])):
        tracker.log_metrics({"loss": i + step / 1000, "mean/acc": step / 2}, step=step)
    tracker.log_artifact(artifact)
"""


def config_file(tmp_path: Path, uri: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"paths": {"data_dir": str(tmp_path / "data"), "results_dir": str(tmp_path / "r"),
                                              "mlflow_uri": uri, "mlflow_experiment": "cluster"}}))
    return path


def run_jobs(tmp_path: Path, uri: str, env: dict, n: int = N_JOBS) -> list[subprocess.CompletedProcess]:
    """``n`` logging jobs started at once; their results once all have ended."""
    config = config_file(tmp_path, uri)
    (tmp_path / "artifacts_in").mkdir(exist_ok=True)
    env = {**env, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", JOB, str(config), str(i), str(tmp_path / "artifacts_in"),
                               str(N_STEPS)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(n)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=600)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


def check_everything_logged(uri: str, env: dict) -> None:
    """Every job's run, params, metric values, tags and artifact are in the store; the table filter finds the
    even jobs only. Reads with MLflow's client under ``env``'s credentials."""
    import mlflow
    from mlflow.tracking import MlflowClient

    saved = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")}
    os.environ.update({k: env[k] for k in saved if k in env})
    try:
        mlflow.set_tracking_uri(uri)
        client = MlflowClient(uri)
        exp = client.get_experiment_by_name("cluster")
        runs = client.search_runs([exp.experiment_id], max_results=1000)
        assert sorted(r.info.run_name for r in runs) == [f"job{i:02d}" for i in range(N_JOBS)]
        for run in runs:
            i = int(run.info.run_name[3:])
            assert run.info.status == "FINISHED"
            assert run.data.params == {"train.lr": str(0.001 * (i + 1)), "train.seed": str(i), "world.world_size": "1"}
            assert run.data.tags["protoclip.run"] == run.info.run_name and run.data.tags["protoclip.kind"] == "train"
            assert run.data.tags["protoclip.stage.train"] == "finished"
            for key, value in (("loss", lambda s: i + s / 1000), ("mean/acc", lambda s: s / 2)):
                history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
                assert history == [(s, value(s)) for s in range(N_STEPS)], (run.info.run_name, key)
            assert [a.path for a in client.list_artifacts(run.info.run_id)] == [f"notes_{i:02d}.txt"]
        table = mlflow.search_runs(experiment_names=["cluster"], filter_string=TABLE_FILTER, output_format="list")
        assert sorted(r.info.run_name for r in table) == [f"job{i:02d}" for i in range(0, N_JOBS, 2)]
        kind = client.get_experiment(exp.experiment_id).tags.get("mlflow.experimentKind")
        assert kind == "custom_model_development"
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# --------------------------------------------------------------------------- one machine: the SQLite default
def test_concurrent_jobs_on_the_sqlite_default_lose_nothing(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    done = run_jobs(tmp_path, uri, env)
    assert [d.returncode for d in done] == [0] * N_JOBS, next(d.stderr[-3000:] for d in done if d.returncode)
    check_everything_logged(uri, env)


def test_a_job_that_loses_the_race_to_create_the_experiment_takes_the_winners(tmp_path):
    """On a server the first jobs create the experiment at once (no file lock there): the losers' create answers
    RESOURCE_ALREADY_EXISTS and they log into the winner's experiment."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from protoclip.tracking import _create_experiment

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    client = MlflowClient()
    winner = client.create_experiment("cluster")
    assert _create_experiment(mlflow, client, "cluster") == winner


# --------------------------------------------------------------------------- a cluster: server + PostgreSQL
@pytest.fixture
def server(mlflow_server):
    """The test run's PostgreSQL and ``mlflow server --app-name basic-auth`` on it (conftest.py)."""
    return mlflow_server


def request(url: str, user: str | None = None, password: str | None = None, body: bool = False):
    """The HTTP status of a GET (with basic-auth credentials when given), or its body (``body``)."""
    req = urllib.request.Request(url)
    if user is not None:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.read() if body else resp.status
    except urllib.error.HTTPError as err:
        return err.code


def test_the_server_refuses_requests_without_valid_credentials(server, tmp_path):
    api = f"{server.uri}/api/2.0/mlflow/experiments/search?max_results=10"
    assert server.command()[server.command().index("--host") + 1] == "127.0.0.1"  # loopback unless told
    assert request(api) == 401
    assert request(api, server.job_user, "wrong") == 401
    assert request(api, server.job_user, server.job_password) == 200
    # a job without credentials in its environment stops (one job, not 16: nothing is logged)
    anonymous = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")}
    (failed,) = run_jobs(tmp_path, server.uri, anonymous, n=1)
    assert failed.returncode != 0 and ("401" in failed.stderr or "Unauthorized" in failed.stderr), failed.stderr


def test_concurrent_authenticated_jobs_on_the_server_lose_nothing(server, tmp_path):
    start = time.monotonic()
    done = run_jobs(tmp_path, server.uri, server.job_env())
    print(f"{N_JOBS} jobs x {N_STEPS} steps on mlflow server + PostgreSQL: {time.monotonic() - start:.0f} s")
    assert [d.returncode for d in done] == [0] * N_JOBS, next(d.stderr[-3000:] for d in done if d.returncode)
    check_everything_logged(server.uri, server.job_env())
    if CHROMIUM is None:
        pytest.skip("chromium not installed (Debian: apt-get install -y chromium): the MLflow UI was not opened")
    dom = screenshot_filtered_table(server, tmp_path / "mlflow_server_table_V.png")
    assert (tmp_path / "mlflow_server_table_V.png").stat().st_size > 10_000
    assert "job00" in dom and "job14" in dom  # the table's runs are listed ...
    assert "job01" not in dom and "job15" not in dom  # ... and only they


def test_a_model_registered_through_the_server_loads_in_open_clip(server, tmp_path, monkeypatch):
    """The train stage's model logging (open_clip export + model.pt as the run's artifacts, a registered version
    with its tags) through the authenticating server and its artifact proxy; the version's models:/ URI downloads
    the folder, which open_clip loads."""
    import mlflow
    import open_clip
    import torch

    from protoclip.project import load_config
    from protoclip.models import save_model
    from protoclip.config.strict import to_dict
    from protoclip.tracking import training_run
    from protoclip.train.config import TrainConfig
    from protoclip.models.export_openclip import export_or_copy
    from protoclip.tracking import log_model

    for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.setenv(key, server.job_env()[key])
    tcfg = TrainConfig(name="served", method="clip", teacher=None, model="tiny-rn", image_size=32, head_hidden=32,
                       head_out=16)
    torch.manual_seed(0)
    model = tcfg.method_class().build_model(tcfg)
    save_model(tmp_path / "model.pt", model, to_dict(tcfg), eval_spec=tcfg.method_class().eval_spec(tcfg))
    cfg = load_config(config_file(tmp_path, server.uri))
    tags = {"protoclip.code_commit": "c" * 40, "protoclip.config_sha256": "f" * 64, "protoclip.data_digest": "d" * 64}
    with training_run(cfg.paths, "served", None, []) as tracker:
        assert log_model(tracker, tmp_path / "model.pt", "served", tags, export_or_copy) == "1"
        run_id = tracker.run_id
    client = mlflow.tracking.MlflowClient(server.uri)
    (version,) = client.search_model_versions("name = 'served'")
    assert version.run_id == run_id and {k: version.tags[k] for k in tags} == tags
    mlflow.set_tracking_uri(server.uri)
    folder = mlflow.artifacts.download_artifacts("models:/served/1", dst_path=str(tmp_path / "download"))
    assert sorted(p.name for p in Path(folder).iterdir()) == ["open_clip_config.json", "open_clip_model.safetensors"]
    oc_model, _, _ = open_clip.create_model_and_transforms(f"local-dir:{folder}")
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(oc_model.eval().encode_image(images), model.eval().encode_image(images))


# --------------------------------------------------------------------------- the UI, as a person sees it
def screenshot_filtered_table(server, out: Path) -> str:
    """The server's runs table filtered by table_V, seen by the jobs' user logged in (through
    :class:`~tracking_server.LoggedInBrowserProxy`): a PNG at ``out``; the page's DOM."""
    exp = json.loads(request(f"{server.uri}/api/2.0/mlflow/experiments/get-by-name?experiment_name=cluster",
                             server.job_user, server.job_password, body=True))
    exp_id = exp["experiment"]["experiment_id"]
    base = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={out.parent / 'chromium-profile'}", "--virtual-time-budget=20000",
            "--window-size=1600,900"]
    with tracking_server.LoggedInBrowserProxy(server.uri, server.job_user, server.job_password) as proxy:
        url = f"{proxy.uri}/#/experiments/{exp_id}/runs?searchFilter={urllib.parse.quote(TABLE_FILTER)}"
        dom = subprocess.run(base + ["--dump-dom", url], capture_output=True, text=True, timeout=180).stdout
        subprocess.run(base + [f"--screenshot={out}", url], capture_output=True, text=True, timeout=180)
    return dom


if __name__ == "__main__":  # manual look: the server, the 16 jobs, a screenshot of the filtered runs table
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "mlflow_server_shot").resolve()
    out.mkdir(parents=True, exist_ok=True)
    with tracking_server.Postgres(out) as pg, tracking_server.MlflowServer(out / "server", pg, auth=True) as srv:
        t0 = time.monotonic()
        results = run_jobs(out, srv.uri, srv.job_env())
        print("jobs:", [r.returncode for r in results], f"{time.monotonic() - t0:.0f} s")
        check_everything_logged(srv.uri, srv.job_env())
        dom = screenshot_filtered_table(srv, out / "mlflow_server_table_V.png")
        print(out / "mlflow_server_table_V.png", "job00" in dom, "job01" in dom)
