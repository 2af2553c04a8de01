"""torch.compile on the story's path.

trace (outcomes named from dynamo's words) and frames (where in user code); target (the
installed FlashInfer and the simulated Blackwell target), stages (the story's patches and
the blocker-chain walk) and fix (the custom op); segment (the FP4 layers under test);
story (the notebooks' shared set-up), crashes (notebooks 01-03), fix_checks (05), tradeoff
(04); matrix, matrix_env, matrix_child and matrix_result (the FlashInfer version matrix,
09); tables and plots."""
