"""``wdstream.DataLoader``, the dataset contract it needs, the datasets that fulfil it
(``StreamingDataset``) and the loader's resume state."""
