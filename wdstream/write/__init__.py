"""Packing records into WebDataset shards: ``inputs`` reads JSON Lines, Parquet, CSV/TSV, folders
and stdin, ``remote`` lists and opens cloud URLs and glob patterns for it; ``packer`` writes
the shards and the manifest; ``cluster`` packs on Ray. The public function is ``wdstream.pack``."""
