"""Reading a dataset while a model trains: the epoch plan, the dataset contract, the datasets
that execute the plan in each worker, the reading pipeline (read, shuffle, decode), batching
and shared-memory transfers, and ``wdstream.DataLoader`` with its state. The table of
docs/architecture.md names each module."""
