"""fp4lab: re-runnable evidence on serving optimizations for FP4-quantized models.

Modules, one concern each: probe (what this machine has), trace (torch.compile
outcomes named from dynamo's own words), flashinfer_path (the story staged on the
installed FlashInfer), nvfp4 (FP4 numerics), segment (the transformer pieces under
test), params (notebook parameter checks), records (results with provenance),
report (decision table and figures), catalog (which notebooks run where),
process (child process groups that never outlive their harness), distributed (ranks
under torchrun and the driver that runs it), collectives (allreduce sweeps), overlap
(the single-batch-overlap microbenchmark), server (SGLang launch, logs, benchmarks).
"""

from fp4lab.paths import set_cache_defaults

set_cache_defaults()

__version__ = "0.1.0"
