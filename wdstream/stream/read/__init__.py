"""Reading a worker's samples: the source resolved, shard ranges and raw files' units read
with prefetch, checks and retries, members decoded."""
