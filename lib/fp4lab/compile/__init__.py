"""torch.compile on the story's path: outcomes named from dynamo's words (trace), FlashInfer
staged on a simulated target with the story's patches and the fix (staging), the layer segment,
the fullgraph=False trade-off and the FlashInfer version matrix."""
