"""From DataLoader workers to the main process: collate, shared memory, JSON left to the main
process, and torch's private DataLoader API."""
