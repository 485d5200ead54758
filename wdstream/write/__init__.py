"""Packing records into WebDataset shards (the public function is ``wdstream.pack``).

The way through: ``inputs`` checks the inputs (``remote`` for cloud URLs and globs) and reads
them as ``batches`` of records (``jsonl``, ``tables``, ``folders``, over ``input_streams``);
``sample_maker`` turns records into samples (``json_records``, ``keys``, sized exactly by
``tar_sizes``); ``sharder`` cuts them into shard ``jobs``; ``shard_writer`` writes one shard, in
this process or a ``pool`` of workers (``tokens`` for ``--tokenize``); ``packer`` runs it all
(``options``) and publishes the manifest; ``merge`` joins part manifests; ``cluster`` packs on
Ray."""
