"""Allreduce sweeps: message sizes, the communicators measured, the per-rank measurement
(``python -m fp4lab.comm.allreduce`` under torchrun), the driver, notebook 07's study and plot."""
