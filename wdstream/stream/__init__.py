"""Reading a dataset while a model trains: the epoch plan (``plan``), the dataset that executes
it in each worker (``dataset``), the reading pipeline (``read``: open, parse, check counts;
``shuffle``, ``window``, ``decode``), batching and collating (``batching``), the transfer of
batches from workers through shared memory (``shm``), the loader and its resumable state
(``loader``), and the clean-up of iterators left open at exit (``lifetime``)."""
