"""Communication under torchrun: allreduce sweeps and the single-batch overlap microbenchmark.

Each benchmark is a rank module run as ``python -m`` on every rank (``allreduce``,
``overlap``, with ``ranks`` for the rank side) and a driver that starts it under torchrun
(``torchrun``, ``allreduce_sweep``, ``overlap_benchmark``); ``allreduce_study`` and
``overlap_study`` are what notebooks 07 and 08 call."""
