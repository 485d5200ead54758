"""Where bytes come from and go to: local paths, ``pipe:`` commands, ``s3://``, ``gs://`` and
other fsspec URLs.

- ``urls``: pure string helpers (``scheme``, ``join``, ``parent``, ``relative_to``, ``expand``,
  ``to_local_path``, ``bucket_key``).
- ``openers``: ``open_read(url, opener=..., timeout=..., start=...)`` -> ``ReadAheadBody``, a
  body filled by a background thread (prefetch), with stall detection and an exit
  status check on close; ``OPENERS`` and ``resolve_opener`` say which reader serves a URL.
  The bodies are in ``bodies`` (``ReadAheadBody``, ``LocalBody``, ``BodySource``), commands
  in ``processes``, clients and fsspec in ``clients``, ranged S3 and GCS reads in ``ranged``,
  error classification in ``failures``.
- ``objects``: ``open_write`` (commit makes the object appear whole, abort leaves nothing;
  the ``Writer`` contract in ``writers``), ``write_bytes``, ``read_bytes``, ``exists``,
  ``delete``, ``size``, ``list_files``; S3's and GCS's own object operations in
  ``s3_objects`` and ``gcs_objects``.
- ``stores``: ``store_for(url)`` picks the URL's store once from its scheme (local, ``pipe:``,
  S3, GCS, any other fsspec protocol); the rest of wdstream calls its methods (describe,
  version, list, open_write, exists, delete, size) and asks its capabilities (``local``,
  ``runs_command``, ``buckets``, ...) rather than comparing schemes.
- ``cache``: ``ShardCache(directory, limit)``, the optional local shard cache (a package:
  ``entry``, ``folder``): ``open(url, opener)`` reads a cached copy, or streams from the
  source while storing it.

Every failure is a ``StreamError`` naming the URL, with ``transient`` saying whether a retry may
help. Cloud SDKs and fsspec back-ends are imported on first use, never at import.
"""
