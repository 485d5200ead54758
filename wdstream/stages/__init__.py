"""Stages over streams for language-model training: the stage contract shared by every stage
(``base``), weighted mixing of datasets (``mix``) with weight schedules (``schedule``), packing
tokenized documents into fixed-length sequences (``sequences``), and building a stage from a
YAML/dict config (``config``)."""
