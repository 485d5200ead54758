"""Integrations with training frameworks, one small module each; every module imports its
framework only when used, so ``import wdstream`` stays light.

- ``wdstream.integrations.accelerate``: ``Accelerator.prepare`` keeps a ``wdstream.DataLoader``
  as it is (it already splits ranks), moves its batches to the device and checkpoints its
  state with ``save_state``/``load_state``.
- ``wdstream.integrations.hf_datasets``: ``to_iterable_dataset`` turns a wdstream dataset into
  a ``datasets.IterableDataset`` with one shard per wdstream stream.
- ``wdstream.integrations.hf_trainer``: ``use_loader`` makes a Hugging Face (or TRL) ``Trainer``
  train from a ``wdstream.DataLoader`` and checkpoint and resume its state.
- ``wdstream.integrations.axolotl``: ``WdstreamPlugin``, an axolotl plugin: ``axolotl train``
  streams the config's datasets through wdstream and resumes them exactly.
- ``wdstream.integrations.checkpoint``: the loader's state in a checkpoint folder, one file
  per rank (used by the two above).

``lightning.Trainer`` needs nothing: it checkpoints a ``wdstream.DataLoader``'s state and
restores it from ``ckpt_path`` on its own (see docs/lightning.md).
"""
