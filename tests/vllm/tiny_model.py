"""Build a tiny Llama model for the vLLM integration test: random weights and a tokenizer trained
on a few sentences, so the test needs nothing from a model hub.

Usage: python -m tests.vllm.tiny_model OUTPUT_DIR
"""

import sys
from pathlib import Path

SENTENCES = [
    "the quick brown fox jumps over the lazy dog",
    "redis keeps the stats of every engine in one place",
    "a fleet of engines serves many requests at once",
    "tokens flow from the prompt to the generation",
    "hello world this is a tiny model for tests",
]


def build(out: Path) -> Path:
    """Write a config, random safetensors weights and a tokenizer into *out*."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=256, special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator(SENTENCES * 10, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(out)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        torch_dtype="float32",
    )
    LlamaForCausalLM(config).to(torch.float32).save_pretrained(out, safe_serialization=True)
    return out


if __name__ == "__main__":
    print(build(Path(sys.argv[1])))
