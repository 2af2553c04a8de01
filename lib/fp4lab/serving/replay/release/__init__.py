"""Inside one SGLang release's environment (the children ``child`` and ``split_check``): the
release imported on a simulated GPU, its own model built and driven through its own runners, the
kernels stood in at their call, what it reached and where it stopped, as JSON for the notebook's
side."""
