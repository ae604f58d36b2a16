"""Writes a tiny random-weight Llama model directory for the real vLLM CPU engine.

Run under the vLLM venv's python (it needs ``tokenizers``):  python make_tiny_model.py OUT_DIR
Geometry from ../shared/reference/vllm-cpu-recipe.md: 2 layers, 4 heads, 2 KV heads, head_dim 32
(the CPU attention kernels support 32; 16 crashes on the first request), vocab 1024, float32:
on this machine bfloat16 selects vLLM's AMX attention kernel, which dies with "Illegal instruction"
on the first request (the VM advertises AMX but does not grant it), so the tests serve float32.
No weights are written: vLLM serves it with ``--load-format dummy``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

VOCAB = 1024
CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
    "vocab_size": VOCAB, "max_position_embeddings": 512, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
    "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32",
}
TEXT = ("The quick brown fox jumps over the lazy dog. GPUs schedule tensor parallel groups; "
        "vLLM batches requests and caches keys and values in blocks. ") * 50
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([TEXT], trainer=trainer)
    missing = VOCAB - tok.get_vocab_size()
    if missing > 0:  # pad to exactly vocab_size so every id the random model emits decodes
        tok.add_tokens([f"<extra_{i}>" for i in range(missing)])
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": 512, "chat_template": CHAT_TEMPLATE}))
    (out / "config.json").write_text(json.dumps(CONFIG, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
