"""Integrations with training frameworks, one small module each, importing its framework only
when used: ``accelerate`` (``Accelerator.prepare``), ``hf_datasets`` (``to_iterable_dataset``),
``hf_trainer`` (``use_loader``), ``axolotl`` (``WdstreamPlugin``) and ``checkpoint`` (one
loader state file per rank). Lightning needs none (docs/lightning.md)."""
