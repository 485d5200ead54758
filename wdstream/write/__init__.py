"""Packing records into WebDataset shards (the public function is ``wdstream.pack``).

The way through: ``inputs`` checks the inputs (``remote`` for cloud URLs and globs,
``local_files`` for what of the local filesystem is read) and reads them as
``record_batches`` (``jsonl``, ``tables`` with ``parquet_pages``, ``folders``, over
``input_bodies``); ``records_to_samples`` turns records into samples (``json_records``, sized
exactly by ``tar_sizes``); ``sharder`` cuts them into shard ``jobs``; ``shard_writer`` writes
one shard, in this process or a ``pool`` of workers (which also read compressed and remote
JSON Lines: ``worker_reads``; ``token_members`` for ``--tokenize``); ``packer`` runs it all
(its options checked by ``pack_options``) and publishes the manifest; ``merge`` joins part
manifests; ``cluster`` packs on Ray."""
