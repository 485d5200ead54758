"""Reading a dataset while a model trains, in four subpackages that each use only the ones
before them: the epoch plan (``plan``), reading a worker's samples (``read``), the transfer
from workers to the main process (``transfer``), and ``wdstream.DataLoader`` with the
datasets it iterates and its state (``load``). The table of docs/architecture.md names each
module."""
