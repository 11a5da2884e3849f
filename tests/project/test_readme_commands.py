"""The READMEs' commands exist and work as pasted.

1. Every ``irbench …`` line of README.md and deploy/README.md (code blocks, commented lines in them,
   and inline code) names a real verb and only real flags of the typer app, and every
   ``deploy/local_cluster.py`` line a real sub-command and flags of its parser.
2. (slow) README.md's runnable blocks are executed in order, as a shell would, in a scratch copy of
   examples/ with the two simulator ports replaced by free ones (the machine is shared).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer.main

from orchestrator.cli.app import app
from tests.support.paths import SHARED
from deploy.processes import free_port

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", REPO / "deploy" / "README.md"]
ELLIPSIS = ("…", "...")


def _commands(md: Path) -> list[tuple[str, bool]]:
    """(command, in a code block) for every irbench / local_cluster.py command in ``md``."""
    out: list[tuple[str, bool]] = []
    in_block = False
    for line in md.read_text(encoding="utf-8").splitlines():
        if line.strip().startswith("```"):
            in_block = not in_block
            continue
        if in_block:
            code = line.strip().lstrip("#").strip()
            if code.startswith(("irbench ", "python3 deploy/local_cluster.py", "python deploy/local_cluster.py")):
                out.append((code, True))
        else:
            out += [(m, False) for m in re.findall(r"`([^`]+)`", line) if m.startswith("irbench ")]
    return out


def _tokens(command: str) -> list[str]:
    tokens = shlex.split(command.replace("[", " ").replace("]", " "), comments=True)
    return [t for t in tokens if t != "&" and not any(e in t for e in ELLIPSIS)]


def _check_irbench(tokens: list[str]) -> None:
    cmd = typer.main.get_command(app)  # typer's own click-like classes: duck-typed
    rest = tokens[1:]
    path = ["irbench"]
    while getattr(cmd, "commands", None) is not None:
        assert rest and not rest[0].startswith("-"), f"{' '.join(path)} needs a sub-command"
        name = rest.pop(0)
        assert name in cmd.commands, f"{' '.join(path)} has no verb {name!r} (has {sorted(cmd.commands)})"
        cmd, path = cmd.commands[name], [*path, name]
    flags = {o for p in cmd.params for o in (*p.opts, *getattr(p, "secondary_opts", ())) if o.startswith("-")}
    for t in rest:
        if t.startswith("-"):
            flag = t.split("=", 1)[0]
            assert flag in flags | {"--help"}, f"{' '.join(path)} has no flag {flag} (has {sorted(flags)})"


def _check_launcher(tokens: list[str]) -> None:
    sys.path.insert(0, str(REPO / "deploy"))
    try:
        import local_cluster
    finally:
        sys.path.pop(0)
    parser = local_cluster._parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    rest = tokens[2:]
    assert rest and rest[0] in sub.choices, f"local_cluster.py has no sub-command {rest[:1]}"
    known = set(sub.choices[rest[0]]._option_string_actions)
    for t in rest[1:]:
        if t.startswith("-"):
            assert t.split("=", 1)[0] in known, f"local_cluster.py {rest[0]} has no flag {t}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_documented_command_names_real_verbs_and_flags(doc: Path) -> None:
    commands = _commands(doc)
    assert len(commands) >= (15 if doc.name == "README.md" and doc.parent == REPO else 3)
    for command, _ in commands:
        tokens = _tokens(command)
        if tokens[0] == "irbench":
            _check_irbench(tokens)
        else:
            _check_launcher(tokens)


def test_the_checker_catches_a_wrong_flag_and_verb() -> None:
    with pytest.raises(AssertionError, match="no flag --dta"):
        _check_irbench(_tokens("irbench run examples/demo.toml --dta data/"))
    with pytest.raises(AssertionError, match="no verb 'analyse'"):
        _check_irbench(_tokens("irbench analyse --data data/"))
    with pytest.raises(AssertionError, match="no verb 'chek'"):
        _check_irbench(_tokens("irbench availability chek --data data/"))


# ------------------------------------------------------------------------------ run them as pasted


def _wait_port(port: int, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"background command exited with {proc.returncode}"
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on {port} after {timeout_s} s")


def _runnable_blocks(md: Path) -> list[list[str]]:
    """Lines of each ```bash block (comments stripped), skipping the `make` block and any block
    with placeholders (HOST, /shared) that only make sense on the reader's machines."""
    blocks, current, in_block, is_shell = [], [], False, False
    for line in md.read_text(encoding="utf-8").splitlines():
        if line.strip().startswith("```"):
            if in_block and is_shell:
                blocks.append(current)
            # campaign snippets (```toml) are checked by test_readme_servers, not run here
            is_shell = not in_block and line.strip()[3:].strip() in ("bash", "sh", "shell")
            current, in_block = [], not in_block
            continue
        if in_block and line.strip():
            current.append(line.strip())
    runnable = []
    for block in blocks:
        code = [ln for ln in block if not ln.startswith("#")]
        if not code or code[0].startswith("make ") or any("/shared/data" in ln or "HOST:" in ln for ln in code):
            continue
        runnable.append([ln for ln in code if "HOST" not in ln])  # the ad-hoc line against a real host
    return runnable


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_readme_blocks_run_in_order_as_pasted(tmp_path: Path) -> None:
    ports = {"8765": str(free_port()), "8766": str(free_port()), "8000": str(free_port())}

    def localise(text: str) -> str:
        for old, new in ports.items():
            text = text.replace(f":{old}", f":{new}").replace(f"--port {old}", f"--port {new}")
        return text

    work = tmp_path / "clone"
    shutil.copytree(REPO / "examples", work / "examples")
    for toml in (work / "examples").glob("*.toml"):
        toml.write_text(localise(toml.read_text()))
    (tmp_path / "shared").symlink_to(SHARED.resolve())  # ../shared/paper-artifact (IRBENCH_SHARED_DIR honoured)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "COLUMNS": "200"}
    env.pop("IRBENCH_DATA", None)
    background: list[subprocess.Popen] = []
    ran: list[str] = []
    try:
        for block in _runnable_blocks(REPO / "README.md"):
            for line in block:
                command = shlex.split(localise(line), comments=True)
                if not command or command[0] in ("source", "kill"):
                    continue  # PATH is set above; the simulators are stopped below
                assert command[0] == "irbench", line
                if command[-1] == "&":
                    proc = subprocess.Popen(command[:-1], cwd=work, env=env, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL, start_new_session=True)
                    background.append(proc)
                    _wait_port(int(command[command.index("--port") + 1]), proc)
                    continue
                out = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=600)
                ran.append(line)
                assert out.returncode == 0, f"{line}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
                assert "Traceback" not in out.stderr, line
                if command[1] == "run" and "--retry-failed" not in command:
                    assert "executed now" in out.stdout, line
                if command[1] == "probe":
                    assert "48 executed now" in " ".join(out.stdout.split()) and "never reached" not in out.stderr
                if command[1:3] == ["availability", "check"]:
                    assert out.stdout.count("available") >= 5, out.stdout
    finally:
        for proc in background:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(20)
    verbs = {shlex.split(line)[1] for line in ran}
    assert {"run", "status", "analyze", "report", "compact", "demo", "import-artifact", "probe",
            "availability"} <= verbs, verbs
    assert (work / "data" / "campaigns").is_dir()  # the ad-hoc run left its campaign file
