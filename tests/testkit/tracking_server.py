"""A real MLflow tracking server for the tests: Debian's PostgreSQL and ``mlflow server`` on loopback, in a temp folder.

    with Postgres(tmp) as pg, MlflowServer(tmp, pg, auth=True) as server:
        env = server.job_env()          # MLFLOW_TRACKING_USERNAME / _PASSWORD of a user the admin created
        ...                             # jobs log to server.uri with protoclip.tracking

PostgreSQL: ``initdb`` into the folder (the database superuser ``mlflow``, password auth on TCP, trust on the
folder's own socket), ``pg_ctl start`` on a free loopback port; PostgreSQL refuses to run as root, so as root
it runs as the ``postgres`` system user that Debian's package creates (``runuser``), in a folder made for it.
MLflow: ``mlflow server --backend-store-uri postgresql://...`` with proxied artifacts in the folder, bound to
127.0.0.1 on a free port; ``auth=True`` adds MLflow's own authentication (``--app-name basic-auth``): its
users in a second PostgreSQL database (``MLFLOW_AUTH_CONFIG_PATH``), the admin's password from
``MLFLOW_AUTH_ADMIN_PASSWORD``, every request without valid credentials refused. Passwords are random per
run and live in the environment and the temp folder only; the server's database URIs hold none (libpq reads
the password from a ``PGPASSFILE``), so none shows in ``ps``.

The packages come from ``.ci/install-postgresql`` and the ``tracking-server`` extra (run by ``make test``);
without them :func:`missing` names what is absent, and the tests skip with that reason, except in CI (``CI``
set), where they fail.
"""
from __future__ import annotations

import base64
import glob
import http.server
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from testkit.services import Service


def pg_bin() -> Path | None:
    """The newest PostgreSQL server's bin folder (Debian: /usr/lib/postgresql/<version>/bin), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


def missing() -> str | None:
    """Why the tracking-server tests cannot run here (None: they can)."""
    if pg_bin() is None:
        return "PostgreSQL is not installed (Debian package postgresql: .ci/install-postgresql, run by make test)"
    for module, pkg in (("psycopg2", "psycopg2-binary"), ("flask_wtf", "Flask-WTF")):
        try:
            __import__(module)
        except ImportError:
            return f"{pkg} is not installed (pip install -e '.[tracking-server]', run by make test)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser: PostgreSQL cannot be started as another user"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(cond, what: str, timeout: float, proc: subprocess.Popen | None = None, log: Path | None = None):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.25)
    tail = log.read_text()[-3000:] if log is not None and log.exists() else ""
    raise AssertionError(f"{what} not up after {timeout:.0f} s\n{tail}")


class Postgres(Service):
    """A PostgreSQL server of its own: ``uri(db)`` for SQLAlchemy / MLflow, ``create_database(name)``."""

    user = "mlflow"

    def __init__(self, parent: Path):
        # its own folder under /tmp, not below pytest's tmp_path: as root, the postgres user must be able to
        # reach it, and pytest's folders are private to root
        self.root = Path(tempfile.mkdtemp(prefix="protoclip-pg-"))
        self.data = self.root / "data"
        self.log = Path(parent) / "postgres.log"
        self.port = free_port()
        self.password = secrets.token_urlsafe(16)
        self.bin = pg_bin()
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *cmd: str, **kw) -> subprocess.CompletedProcess:
        out = subprocess.run([*self.as_user, *cmd], capture_output=True, text=True, cwd=self.root, **kw)
        if out.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed ({out.returncode}): {out.stdout}\n{out.stderr}")
        return out

    def start(self) -> "Postgres":
        pwfile = self.root / "pw"
        pwfile.write_text(self.password + "\n")
        if self.as_user:
            shutil.chown(self.root, "postgres")
            shutil.chown(pwfile, "postgres")
        self.root.chmod(0o700)
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", self.user, "--pwfile", str(pwfile),
                  "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--no-locale")
        pwfile.unlink()
        opts = f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories={self.root}"
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "server.log"), "-w",
                  "-t", "120", "-o", opts, "start")
        return self

    def create_database(self, name: str) -> None:
        self._run(str(self.bin / "psql"), "-h", str(self.root), "-p", str(self.port), "-U", self.user, "-d",
                  "postgres", "-v", "ON_ERROR_STOP=1", "-c", f"CREATE DATABASE {name}")

    def uri(self, db: str) -> str:
        """The database's URI, without the password: libpq reads it from :meth:`env`'s password file."""
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{db}"

    def env(self) -> dict:
        """What a client of the server needs in its environment: the password file (PGPASSFILE, mode 600)."""
        pgpass = self.log.parent / "pgpass"
        if not pgpass.exists():
            pgpass.write_text(f"127.0.0.1:{self.port}:*:{self.user}:{self.password}\n")
            pgpass.chmod(0o600)
        return {"PGPASSFILE": str(pgpass)}

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            subprocess.run([*self.as_user, str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w",
                            "stop"], capture_output=True, cwd=self.root)
        server_log = self.root / "server.log"
        if server_log.exists():
            self.log.write_text(server_log.read_text())
        shutil.rmtree(self.root, ignore_errors=True)


class MlflowServer(Service):
    """``mlflow server`` on PostgreSQL, on 127.0.0.1:<free port>; with ``auth``, MLflow's basic-auth app."""

    admin = "admin"
    job_user = "jobs"

    def __init__(self, root: Path, pg: Postgres, auth: bool = False, workers: int = 2):
        self.root = Path(root)
        self.pg, self.auth, self.workers = pg, auth, workers
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.log = self.root / "mlflow_server.log"
        self.admin_password = secrets.token_urlsafe(16)
        self.job_password = secrets.token_urlsafe(16)
        self.proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        """The README's server command, on this PostgreSQL and a free loopback port."""
        cmd = [str(Path(sys.executable).with_name("mlflow")), "server",
               "--backend-store-uri", self.pg.uri("mlflow"), "--artifacts-destination", str(self.root / "artifacts"),
               "--host", "127.0.0.1", "--port", str(self.port), "--workers", str(self.workers),
               # uvicorn restarts a worker that misses a 5 s health check, mid-request: on a busy host (16 jobs
               # starting at once on 2 cores here) workers were killed in a loop
               "--uvicorn-opts", "--timeout-worker-healthcheck 120"]
        return cmd + (["--app-name", "basic-auth"] if self.auth else [])

    def server_env(self) -> dict:
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}, **self.pg.env()}
        if self.auth:
            ini = self.root / "basic_auth.ini"
            # the README's basic_auth.ini; the credential cache spares each request a PBKDF2 hash (many jobs)
            ini.write_text("[mlflow]\ndefault_permission = READ\n"
                           f"database_uri = {self.pg.uri('mlflow_auth')}\nadmin_username = {self.admin}\n"
                           "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
                           "auth_cache_ttl_seconds = 300\n")
            # the admin's password is read at the first start only; the secret key signs the UI's CSRF tokens
            env.update(MLFLOW_AUTH_CONFIG_PATH=str(ini), MLFLOW_AUTH_ADMIN_PASSWORD=self.admin_password,
                       MLFLOW_FLASK_SERVER_SECRET_KEY=secrets.token_urlsafe(32))
        return env

    def start(self) -> "MlflowServer":
        self.root.mkdir(parents=True, exist_ok=True)
        self.pg.create_database("mlflow")
        if self.auth:
            self.pg.create_database("mlflow_auth")
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(self.command(), env=self.server_env(), stdout=log, stderr=subprocess.STDOUT,
                                         cwd=self.root, start_new_session=True)
        wait_until(self.healthy, "mlflow server", 180, self.proc, self.log)
        if self.auth:
            self.create_job_user()
        return self

    def healthy(self) -> bool:
        try:
            return urllib.request.urlopen(f"{self.uri}/health", timeout=2).status == 200
        except OSError:
            return False

    def create_job_user(self) -> None:
        """The jobs' user, made by the admin through MLflow's auth client (as the README shows)."""
        code = ("import os; from mlflow.server import get_app_client; "
                "get_app_client('basic-auth', tracking_uri=os.environ['URI']).create_user("
                "username=os.environ['NEW_USER'], password=os.environ['NEW_PASSWORD'])")
        env = {**os.environ, "URI": self.uri, "MLFLOW_TRACKING_USERNAME": self.admin,
               "MLFLOW_TRACKING_PASSWORD": self.admin_password, "NEW_USER": self.job_user,
               "NEW_PASSWORD": self.job_password}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]

    def job_env(self, base: dict | None = None) -> dict:
        """``base`` with the jobs' credentials in MLflow's own variables (with ``auth``)."""
        env = {k: v for k, v in (os.environ if base is None else base).items()
               if k not in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_URI")}
        if self.auth:
            env.update(MLFLOW_TRACKING_USERNAME=self.job_user, MLFLOW_TRACKING_PASSWORD=self.job_password)
        return env

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)  # the server and its workers
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()


class LoggedInBrowserProxy:
    """A loopback proxy to ``target`` that adds a user's basic-auth header to every request: what a browser does
    once the person has typed the login MLflow's server asks for. Headless Chromium cannot type it, and a URL
    with credentials in it breaks the UI's own requests (``fetch`` refuses such URLs).

        with LoggedInBrowserProxy(server.uri, "jobs", password) as proxy:
            chromium --screenshot=... f"{proxy.uri}/#/experiments/1/runs"
    """

    HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-authorization",
           "proxy-authenticate", "host", "content-length"}

    def __init__(self, target: str, user: str, password: str):
        auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        hop, target = self.HOP, target.rstrip("/")

        class Handler(http.server.BaseHTTPRequestHandler):
            def forward(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in hop}
                req = urllib.request.Request(target + self.path, data=body, method=self.command,
                                             headers={**headers, "Authorization": auth})
                try:
                    resp = urllib.request.urlopen(req, timeout=120)
                except urllib.error.HTTPError as err:
                    resp = err
                data = resp.read()
                self.send_response(resp.status if hasattr(resp, "status") else resp.code)
                for k, v in resp.headers.items():
                    if k.lower() not in hop:
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = forward

            def log_message(self, *args):  # quiet
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.uri = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> "LoggedInBrowserProxy":
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
