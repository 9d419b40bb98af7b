"""Build a tiny random-weight Llama model and a byte-level BPE tokenizer locally (no downloads).

Run with the vLLM venv's Python: ``build_tiny_model.py OUT_DIR [--hidden N --intermediate N --layers N
--vocab N]``. The default sizes are the smallest vLLM's CPU backend accepts (attention head size must be at
least 32). The vintage P/D target uses many thin layers (hidden 256, intermediate 704, 16 layers, vocab
8192, ~29 MB; tests/targets/setup_vllm_vintage.sh): its per-layer tensors cross glibc's mmap threshold every
step, so the workers munmap like production ones.
"""

from __future__ import annotations

import argparse
from pathlib import Path

# Local text to train the tokenizer on: enough distinct words for ~1k merges.
_TEXT = """
The quick brown fox jumps over the lazy dog. Memory leaks hide in native code, outside the Python heap.
Prefill and decode instances exchange key value caches over NIXL and UCX. A registration cache keeps
memory regions registered; an invalidation queue records unmapped ranges until they are released.
Requests arrive, tokens are generated, and the resident set size of the decode worker grows slowly.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 64 128 256 512 1024. Hello world, how are you today?
""" * 4

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build(out: Path, hidden: int = 64, intermediate: int = 128, layers: int = 2, vocab: int = 1024) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    special = ["<unk>", "<s>", "</s>", "<pad>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # The local text holds ~1k merges at most: a larger model vocabulary keeps ids the tokenizer never makes.
    trainer = trainers.BpeTrainer(vocab_size=min(vocab, 1024), special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_TEXT.splitlines(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=hidden // 32, num_key_value_heads=hidden // 32, head_dim=32, max_position_embeddings=1024,
        bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id,
        tie_word_embeddings=True, torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--intermediate", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=1024)
    a = ap.parse_args()
    build(a.out, a.hidden, a.intermediate, a.layers, a.vocab)
