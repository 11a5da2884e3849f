"""Checks behind the campaign spec (``orchestrator.campaign.spec``): single values (model names,
URLs, key-looking strings) and the one-line problem messages made from a raw TOML document or
a pydantic ``ValidationError``. Each problem names the file and the field path.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Collection
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ValidationError

SLUG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# Model ids as providers spell them ("gpt-4o", "gemma3:12b", "meta-llama/Llama-3-8B@v2"): no
# whitespace, control characters, quotes, angle brackets, backslashes or '..' path segments.
MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,199}$")
MODEL_NAME_HINT = "only letters, digits and . _ : / @ + - (at most 200; no spaces, control characters or '..' segments)"
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Prefixes of real provider keys (OpenAI, Anthropic, GitHub, Groq, xAI, HF, Google, Stripe-like).
KEY_LITERAL_RE = re.compile(r"^(sk-|sk_|ghp_|gho_|github_pat_|gsk_|xai-|hf_|AIza|pk-|rk-)[A-Za-z0-9_\-]{12,}$")
# Key names that would put a secret into the campaign file.
SECRET_KEY_NAMES = frozenset({"api_key", "apikey", "api-key", "authorization", "secret", "password", "token"})


def looks_like_key(value: str) -> bool:
    """True when ``value`` looks like a secret rather than an environment variable name."""
    if KEY_LITERAL_RE.match(value):
        return True
    # Env var names are short and mostly upper case; keys are long mixed-case/digit strings.
    return len(value) >= 32 and any(c.islower() for c in value) and any(c.isdigit() for c in value)


def check_model_name(name: str) -> str:
    """``name`` if it is a safe model id (``MODEL_NAME_RE``, no ``..`` segment, no ``//``)."""
    segments = name.split("/")
    if not MODEL_NAME_RE.match(name) or ".." in segments or "" in segments:
        raise ValueError(f"{shown(name)} is not a valid model name; use {MODEL_NAME_HINT}")
    return name


def shown(value: str) -> str:
    """``repr`` of a user value, shortened (a hostile value must not flood the one-line error)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_http_url(value: str) -> str:
    """``value`` without trailing slashes if it is an http(s) URL with a host and a valid port;
    ``ValueError`` saying what to fix otherwise. Credentials in the URL are refused (keys go in
    environment variables)."""
    example = "write e.g. 'http://127.0.0.1:8765'"
    if not isinstance(value, str) or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError(f"{shown(value)} contains whitespace or control characters; {example}")
    try:
        parts = urlsplit(value)
        port = parts.port  # raises ValueError when out of 0-65535 or not a number
    except ValueError as exc:
        raise ValueError(f"{shown(value)} is not a valid URL ({exc}); {example}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{shown(value)} is not an http(s) URL with a host; {example}")
    if port == 0:
        raise ValueError(f"{shown(value)}: port 0 is not a port; use 1-65535")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"{shown(value)}: credentials in the URL are not allowed; put the key in an environment variable and name it in api_key_env")
    if parts.query or parts.fragment:
        raise ValueError(f"{shown(value)}: a base_url has no query or fragment; give scheme://host:port[/path]")
    return value.rstrip("/")


def fmt_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def allowed_fields(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Field names valid at ``loc``'s parent, for did-you-mean hints."""
    cur: Any = model
    for part in loc[:-1]:
        if isinstance(cur, type) and issubclass(cur, BaseModel):
            f = cur.model_fields.get(str(part))
            if f is None:
                return []
            ann = f.annotation
            args = getattr(ann, "__args__", ())
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                cur = ann
            elif args and isinstance(args[-1], type) and issubclass(args[-1], BaseModel):
                cur = ("dict", args[-1])  # dict[str, Model]: next part is a key
            else:
                return []
        elif isinstance(cur, tuple):
            cur = cur[1]
        else:
            return []
    if isinstance(cur, type) and issubclass(cur, BaseModel):
        return list(cur.model_fields)
    return []


def problem_lines(
    fname: str, err: ValidationError, model: type[BaseModel], none_able: Collection[str] = (),
    prefix: tuple[Any, ...] = (),
) -> list[str]:
    """One line per error of ``err`` (validating ``model``); a parse error on a field of
    ``none_able`` adds the hint that ``"none"`` means no cap."""
    lines = []
    for e in err.errors():
        loc = prefix + tuple(e["loc"])
        where = fmt_loc(loc)
        if e["type"] == "extra_forbidden" and str(loc[-1]).lower() in SECRET_KEY_NAMES:
            continue  # already reported by scan_secrets with a better message
        if e["type"] == "extra_forbidden":
            allowed = [a for a in allowed_fields(model, tuple(e["loc"])) if a != "base_dir"]
            near = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else (f" (allowed: {', '.join(allowed)})" if allowed else "")
            lines.append(f"{fname}: {where}: unknown key{hint}")
        elif e["type"] == "missing":
            lines.append(f"{fname}: {where}: required field is missing")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            got = repr(e.get("input"))
            got = got if len(got) <= 60 else got[:57] + "..."
            hint = '; write a number, or "none" for no cap' if str(loc[-1]) in none_able and e["type"].endswith("_parsing") else ""
            lines.append(f"{fname}: {where}: {msg} (got {got}){hint}" if e["type"] != "value_error" else f"{fname}: {where}: {msg}")
    return lines


def scan_secrets(fname: str, node: Any, loc: tuple[Any, ...], out: list[str]) -> None:
    """Reject secret-looking key names and key-looking values anywhere in the document."""
    if isinstance(node, dict):
        for k, v in node.items():
            here = loc + (k,)
            if str(k).lower() in SECRET_KEY_NAMES:
                out.append(
                    f"{fname}: {fmt_loc(here)}: never put a secret in the campaign file; export it in an "
                    f"environment variable and set api_key_env = \"THAT_VARIABLE_NAME\" on the endpoint"
                )
            else:
                scan_secrets(fname, v, here, out)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            scan_secrets(fname, v, loc + (i,), out)
    elif isinstance(node, str) and KEY_LITERAL_RE.match(node) and loc[-1:] != ("api_key_env",):
        out.append(f"{fname}: {fmt_loc(loc)}: value looks like an API key; keys belong in environment variables, never in the campaign file")
