"""The shard format: a compact reproducible tar writer and a fast streaming reader (``tar``),
WebDataset's key/extension rules and sample grouping (``samples``), the dataset manifest
(``manifest``), and manifests for existing shards and merging (``index``)."""
