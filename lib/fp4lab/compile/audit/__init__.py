"""A fullgraph readiness audit of FlashInfer's public FP4 API, version by version (notebook 12),
and of any callable (``python -m fp4lab.compile.audit module:function --sm 12.0``).

surface (the FP4 entry points the installed FlashInfer has), inputs (input specs, and inputs
built from a signature), run (one callable through the blocker-chain walk), child (inside a
version's environment), study (notebook 12's calls and records), plots (the heat map)."""
