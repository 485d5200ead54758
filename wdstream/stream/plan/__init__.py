"""The epoch plan: which samples each rank and DataLoader worker reads, in which order, as
pure functions (no I/O)."""
