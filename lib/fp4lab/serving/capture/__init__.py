"""SGLang's own piecewise backend driven on a model, with CUDA-graph capture real on a GPU and
imitated at its boundary on a CPU (``recorder``); the drive runs inside a release's environment
(``sglang_backend``), the study runs it per release and decides (``study``)."""
