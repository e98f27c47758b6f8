"""A real JupyterLab server and a real headless Chromium for the end-to-end widget tests.

`lab` starts `jupyter lab` from this interpreter's environment on a free loopback port with a fresh
token, serving a temporary copy of notebooks/ (so no executed notebook or checkpoint is left in the
repository), and always stops it, kernels included. `browser` is Playwright driving Debian's
Chromium. Both skip with a reason when Chromium or Playwright is missing, so the rest of the suite
runs on a laptop without them.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS_DIR = ROOT / "notebooks"
RUNS_DIR = ROOT / "runs" / "browser"
CHROMIUM = Path(os.environ.get("COURSE_CHROMIUM", "/usr/bin/chromium"))
# What this machine needs to start Chromium as root with no network beyond the package registries.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SERVER_START_S = 90      # jupyter lab cold start on 2 cores is ~5-15 s
BIND_ATTEMPTS = 5


def pytest_configure(config):
    config.addinivalue_line("markers", "browser: drives JupyterLab in headless Chromium (needs Chromium + playwright)")


def missing_requirement() -> str | None:
    """Why the browser suite cannot run here, or None."""
    if not (CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK)):
        return (f"browser suite skipped: no Chromium at {CHROMIUM} (Debian/Ubuntu: "
                "apt-get install --no-install-recommends chromium; or set COURSE_CHROMIUM)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "browser suite skipped: playwright is not installed (pip install -e '.[dev]')"
    return None


@pytest.fixture(scope="session")
def browser_requirements():
    why = missing_requirement()
    if why:
        pytest.skip(why)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LabServer:
    """One `jupyter lab` process (its own process group) and how to talk to it."""

    def __init__(self, root: Path, notebook_dir: Path, env: dict[str, str]):
        self.root, self.notebook_dir, self.env = root, notebook_dir, env
        self.token = secrets.token_hex(24)
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.log_path = root / "server.log"

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> "LabServer":
        """Start on a free port; if binding fails (the port was taken meanwhile), retry on another."""
        for _ in range(BIND_ATTEMPTS):
            self.port = free_port()
            cmd = [sys.executable, "-m", "jupyterlab", "--no-browser",
                   "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
                   f"--IdentityProvider.token={self.token}", "--ServerApp.open_browser=False",
                   f"--ServerApp.root_dir={self.notebook_dir}",
                   "--LabApp.news_url=None",
                   "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                   "--ServerApp.terminals_enabled=False"]
            if hasattr(os, "geteuid") and os.geteuid() == 0:
                cmd.append("--allow-root")  # CI containers run as root
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(cmd, cwd=self.notebook_dir, env=self.env, stdout=log,
                                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             start_new_session=True)
            if self._wait_ready():
                return self
            bind_failed = "already in use" in self.log_tail() or "Address already" in self.log_tail()
            self.stop()
            if not bind_failed:
                break
        raise RuntimeError(f"jupyter lab did not start (port {self.port}); log:\n{self.log_tail()}")

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                self.api("GET", "api/status", timeout=5)
                return True
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.5)
        return False

    def stop(self) -> None:
        """Shut kernels down, then stop the server's process group; kill anything left over."""
        if self.proc is None:
            return
        import psutil  # a dependency of ipykernel, so always in the course's environment

        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            children = []
        if self.proc.poll() is None:
            try:
                for session in self.api("GET", "api/sessions", timeout=5):
                    self.api("DELETE", f"api/sessions/{session['id']}", timeout=20)
            except Exception:  # the server may be the thing that broke; the signals below still run
                pass
            for sig, grace in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
        # Kernels run in sessions of their own (jupyter_client starts them with setsid).
        alive = [p for p in children if p.is_running()]
        for p in alive:
            try:
                p.terminate()
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(alive, timeout=10)
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=5)
        self.proc = None

    # -- talking to it ---------------------------------------------------------------------------
    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def url(self, path: str) -> str:
        return f"{self.base}{path}?token={self.token}"

    def api(self, method: str, path: str, timeout: float = 10):
        req = urllib.request.Request(self.base + path, method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def shutdown_kernel_of(self, notebook: str) -> None:
        """End the session (and kernel) of one notebook so the next one gets the CPU to itself."""
        for session in self.api("GET", "api/sessions"):
            if session.get("path", "").endswith(notebook):
                self.api("DELETE", f"api/sessions/{session['id']}", timeout=30)

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


@pytest.fixture(scope="session")
def lab(browser_requirements, tmp_path_factory):
    """A running JupyterLab on a temporary copy of notebooks/, stopped whatever happens."""
    root = tmp_path_factory.mktemp("jupyterlab")
    notebook_dir = root / "notebooks"
    shutil.copytree(NOTEBOOKS_DIR, notebook_dir, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    env = dict(os.environ)
    env.update({
        "COURSE_HEADLESS": "1",                  # quiet progress bars; panels still show (INTERACTIVE=True)
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "COURSE_RESULTS_DIR": str(root / "results"),   # records go here, not to the repo's runs/
        "MPLBACKEND": "module://matplotlib_inline.backend_inline",
        "JUPYTER_CONFIG_DIR": str(root / "config"),     # no user config leaks in
        "JUPYTER_RUNTIME_DIR": str(root / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(root / "lab-settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(root / "lab-workspaces"),
    })
    # No "would you like news?" toast over the panels in the screenshots.
    settings = root / "lab-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    server = LabServer(root, notebook_dir, env)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def browser(browser_requirements, tmp_path_factory):
    """A headless Chromium (a fresh profile) driven by Playwright."""
    from playwright.sync_api import sync_playwright

    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1200})
        try:
            yield context
        finally:
            context.close()
