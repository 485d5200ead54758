"""Reading a dataset while a model trains: the epoch plan (``plan``), the dataset contract
(``contract``) and what a stream reports (``context``), the datasets that execute the plan in
each worker (``positioned``, ``dataset``, with ``resolve`` for their sources), the reading
pipeline (``read``: open, parse, check counts; ``shuffle``, ``window``, ``decode``), batching
and collating (``batching``), the transfer of batches from workers through shared memory
(``shm``), the loader (``loader``; its collate wrapper ``tagging``, its argument checks
``loader_options``, its resumable state ``loader_state``), and the clean-up of iterators left
open at exit (``lifetime``)."""
