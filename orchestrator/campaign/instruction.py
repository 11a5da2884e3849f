"""The inference instruction: a versioned template that wraps one prompt into one user message.

A template is a UTF-8 text file. An optional first line ``#! irbench-instruction <version>``
declares its version and is not sent to the model; without it the version is
``custom-<file stem>``. The file's sha256 (of its bytes, header included) is recorded with
every run, so two different templates can never be confused even under one version label.

Placeholders: ``{prompt}`` (required, exactly once, on its own line between the lines
``--- BEGIN PROMPT ---`` and ``--- END PROMPT ---``), ``{uri}`` (the prompt's name) and
``{version}``. Substitution is one pass over the *template* only, so braces inside the prompt
text (Jinja ``{% if %}``, JSON, ``{uri}`` literally) are never interpreted, and any other brace
in the template (e.g. a JSON example) is left as written.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from workers.errors import ConfigError

BEGIN_MARKER = "--- BEGIN PROMPT ---"
END_MARKER = "--- END PROMPT ---"
HEADER_RE = re.compile(r"^#! irbench-instruction (\S+)[ \t]*\r?\n")
PLACEHOLDER_RE = re.compile(r"\{(uri|prompt|version)\}")
BUILTIN_TEMPLATE = "instruction_v1.txt"


@dataclass(frozen=True)
class Instruction:
    """A loaded template. ``sha256`` is of the template file's bytes; ``source`` says where it came from."""

    version: str
    sha256: str
    template: str
    source: str = "builtin"

    def render(self, prompt_name: str, prompt_text: str) -> str:
        """The user message for one prompt: the template with ``{uri}``/``{prompt}``/``{version}`` filled.

        One trailing newline of ``prompt_text`` is dropped so that the END marker sits on the line
        right after the prompt's last line (line numbers inside the markers start at 1).
        """
        body = prompt_text[:-1] if prompt_text.endswith("\n") else prompt_text
        values = {"uri": prompt_name, "prompt": body, "version": self.version}
        return PLACEHOLDER_RE.sub(lambda m: values[m.group(1)], self.template)


def _parse(data: bytes, source: str, default_version: str) -> Instruction:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: instruction template is not valid UTF-8 (byte offset {exc.start}); save it as UTF-8") from None
    version = default_version
    m = HEADER_RE.match(text)
    if m:
        version, text = m.group(1), text[m.end():]
    problems = []
    lines = text.splitlines()
    n_prompt = text.count("{prompt}")
    if n_prompt != 1:
        problems.append(f"{source}: the template must contain the placeholder {{prompt}} exactly once (found {n_prompt})")
    else:
        try:
            i = lines.index("{prompt}")
        except ValueError:
            problems.append(f"{source}: {{prompt}} must stand alone on its own line")
        else:
            if i == 0 or lines[i - 1].strip() != BEGIN_MARKER or i + 1 >= len(lines) or lines[i + 1].strip() != END_MARKER:
                problems.append(
                    f"{source}: put {{prompt}} on its own line between a line '{BEGIN_MARKER}' and a line "
                    f"'{END_MARKER}' (the simulator and the audit locate the prompt by these markers)"
                )
    if problems:
        raise ConfigError(f"{source}: invalid instruction template", problems)
    return Instruction(version=version, sha256=hashlib.sha256(data).hexdigest(), template=text, source=source)


def load_instruction(path: Path | None = None) -> Instruction:
    """Load a custom template file, or the built-in ``irbench-v1`` template when ``path`` is None."""
    if path is None:
        data = resources.files("orchestrator.campaign").joinpath("templates", BUILTIN_TEMPLATE).read_bytes()
        return _parse(data, "builtin:" + BUILTIN_TEMPLATE, "irbench-v1")
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read instruction template ({exc.strerror or exc}); check the `instruction` path") from None
    return _parse(data, str(path), f"custom-{path.stem}")
