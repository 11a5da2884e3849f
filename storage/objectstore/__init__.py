"""The store on an S3-compatible bucket: ``--data s3://BUCKET/PREFIX``, a client, a local mirror, an uploader."""

__all__ = [
    "client",
    "location",
    "mirror",
    "session",
    "uploader",
]
