"""Where a store lives: a local directory or ``s3://BUCKET/PREFIX``.

Every verb's ``--data`` (and ``IRBENCH_DATA``) takes either; :func:`parse_store_url` says which,
without touching the network.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from storage.errors import ConfigError

SCHEME = "s3://"
# S3's bucket naming rules (lower-case letters, digits, dots, hyphens; 3 to 63 characters)
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")


@dataclass(frozen=True)
class S3Location:
    """A store at ``s3://bucket/prefix``. ``prefix`` has no leading or trailing slash ('' = the
    bucket's top). Object keys are ``prefix/<path under the store root>``."""

    bucket: str
    prefix: str = ""

    @property
    def url(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.prefix}" if self.prefix else f"{SCHEME}{self.bucket}"

    def key(self, relative: str) -> str:
        """The object key of ``relative`` (a POSIX path under the store root)."""
        return f"{self.prefix}/{relative}" if self.prefix else relative

    def relative(self, key: str) -> str:
        """The path under the store root of object ``key`` (inverse of :meth:`key`)."""
        if not self.prefix:
            return key
        head = self.prefix + "/"
        if not key.startswith(head):
            raise ValueError(f"{key!r} is not under {self.url}")
        return key[len(head):]

    def __str__(self) -> str:
        return self.url


def is_store_url(text: str) -> bool:
    """True when ``text`` names a bucket (``s3://…``), not a directory."""
    return text.lower().startswith(SCHEME)


def parse_store_url(text: str) -> S3Location:
    """``s3://BUCKET[/PREFIX]`` as an :class:`S3Location`; ConfigError (one line) when malformed."""
    if not is_store_url(text):
        raise ConfigError(f"{text!r} is not an s3:// URL; give --data s3://BUCKET/PREFIX or a directory")
    rest = text[len(SCHEME):]
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET_RE.match(bucket):
        raise ConfigError(f"{text!r}: {bucket!r} is not a valid bucket name (3-63 lower-case letters, "
                          "digits, dots or hyphens); give --data s3://BUCKET/PREFIX")
    prefix = prefix.strip("/")
    if any(part in ("", ".", "..") for part in prefix.split("/")) and prefix:
        raise ConfigError(f"{text!r}: the prefix has an empty, '.' or '..' part; give --data s3://BUCKET/a/b")
    return S3Location(bucket, prefix)
