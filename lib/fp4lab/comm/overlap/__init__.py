"""The single-batch-overlap microbenchmark: MoE shapes and checks, the per-rank pipeline
(``python -m fp4lab.comm.overlap`` under torchrun), the driver, notebook 08's study and plot."""
