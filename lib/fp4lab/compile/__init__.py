"""torch.compile on the story's path.

trace (outcomes named from dynamo's words) and frames (where in user code); target (the
installed FlashInfer and the simulated Blackwell target), stages (the story's patches, their
origins, and the blocker-chain walk) and fix (the custom op, and which kernel ran); segment
(the FP4 layers under test); story (the notebooks' shared set-up), crashes (notebooks 01-03),
fix_checks (05), tradeoff (04); matrix/ (the FlashInfer version matrix, 09: versions, env,
child, result, study); tables and plots."""
