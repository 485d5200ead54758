"""``wdstream.from_config``: a trainer's config file, or a declarative dataset list, turned into
a dataset (``build``); its keys, one row each with its type and limits (``keys``); config
files read from storage within bounds (``files``)."""
