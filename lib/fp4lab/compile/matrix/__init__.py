"""Is it still blocked? The story's FP4 trace against a list of FlashInfer versions (notebook 09).

versions (the defaults and their check), env (one environment per version under build/matrix/
and the child run inside it), child (what runs in that environment, behind
``python -m fp4lab.compile.matrix.child``), result (each version's verdict and the summary
across versions), study (notebook 09's calls); ``python -m fp4lab.compile.matrix run``."""
