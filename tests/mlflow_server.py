"""A real `mlflow server` on a free loopback port, for the tests that kill and restart a tracking server."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """`mlflow server` over a SQLite store and an artifact folder in `folder`; start() and kill() as often as a test
    needs, on the same port and store."""

    def __init__(self, folder: Path, port: int | None = None):
        self.folder, self.port = folder, port or free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self.starts = 0

    def start(self, timeout_s: float = 180) -> None:
        self.starts += 1
        log = open(self.folder / f"server_{self.starts}.log", "w")  # noqa: SIM115 (the server's until it ends)
        self.process = subprocess.Popen(
            [str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
             "--backend-store-uri", f"sqlite:///{self.folder / 'server.db'}",
             "--artifacts-destination", str(self.folder / "artifacts")], stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)  # its own process group: kill() takes the workers with it
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {(self.folder / f'server_{self.starts}.log').read_text()}")
            try:
                urllib.request.urlopen(self.uri + "/health", timeout=2).close()
                return
            except OSError:
                time.sleep(0.5)
        raise TimeoutError(f"mlflow server on {self.uri} did not answer within {timeout_s} s")

    def kill(self) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        # the workers the server started may outlive it for a moment: wait until the port is free
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(self.uri + "/health", timeout=1).close()
                time.sleep(0.2)
            except OSError:
                return
