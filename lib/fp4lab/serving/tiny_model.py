"""A model to serve offline: a randomly initialised small Llama and a tokenizer trained here,
so a GPU machine without network access can start a real server."""

from __future__ import annotations

from pathlib import Path

from fp4lab.core import params

_CORPUS = (
    "The quick brown fox jumps over the lazy dog. Piecewise CUDA graphs capture the pieces between attention layers. "
    "MSCCLPP allreduce and single batch overlap move communication off the critical path. 0123456789 +-*/=()[]{}<>"
)


def make_tiny_model(
    folder: Path,
    *,
    hidden: int = 512,
    layers: int = 2,
    heads: int = 8,
    kv_heads: int = 8,
    intermediate: int = 1024,
    vocab: int = 1024,
    max_position: int = 4096,
    seed: int = 0,
) -> Path:
    """Save a randomly initialised small Llama-architecture model and a byte-level BPE tokenizer to ``folder``.

    Nothing is downloaded: the tokenizer is trained here on a fixed sentence. Defaults give
    head_dim 64 (an attention-kernel size every backend supports) and 8 attention and KV heads,
    so any tensor-parallel size from 1 to 8 that divides 8 works.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    for name, value in (
        ("hidden", hidden),
        ("layers", layers),
        ("heads", heads),
        ("kv_heads", kv_heads),
        ("intermediate", intermediate),
        ("vocab", vocab),
        ("max_position", max_position),
    ):
        params.positive(name, value)
    if hidden % heads or heads % kv_heads:
        raise ValueError(
            f"hidden={hidden}, heads={heads}, kv_heads={kv_heads}: "
            "heads must divide hidden and kv_heads must divide heads"
        )
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)

    specials = ["<|pad|>", "<|bos|>", "<|eos|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        [_CORPUS] * 8,
        trainers.BpeTrainer(
            vocab_size=vocab,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, pad_token=specials[0], bos_token=specials[1], eos_token=specials[2]
    )
    tokenizer.model_max_length = max_position
    tokenizer.save_pretrained(folder)

    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_position,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False, torch_dtype="bfloat16",
    )  # fmt: skip
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    return folder
