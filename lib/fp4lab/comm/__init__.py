"""Communication under torchrun: the driver (torchrun), allreduce sweeps, the single-batch
overlap microbenchmark; each benchmark runs as ``python -m`` on every rank."""
