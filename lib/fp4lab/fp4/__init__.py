"""FP4 numerics: the spec-exact NVFP4/MXFP4 reference, fast kernels, cross-checks with
independent peers, error and throughput measurement, FlashInfer's kernel checks."""
