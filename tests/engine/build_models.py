"""Build the tiny Llama target, its tokenizer and noisy-copy drafts, with no download.

Run with the vLLM venv's python (it has torch, transformers, tokenizers, safetensors):
``python build_models.py OUT_DIR`` writes OUT_DIR/target, OUT_DIR/draft-noise-<pct> for
each noise level (0 = an exact copy), OUT_DIR/draft-headdim-16 (a configuration the CPU
attention kernels refuse) and OUT_DIR/bigram (the target's tokenizer, hand-set weights: the
next token follows a chain of words, ``chain.json``; for an n-gram draft).
Recipe: reference/vllm-cpu.md §3-4.
"""

from __future__ import annotations

import glob
import json
import os
import random
import shutil
import sys

NOISE_LEVELS = (0.0, 0.1)


def build_target(out: str) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    files = [f for f in sorted(glob.glob("/usr/share/common-licenses/*")) if os.path.isfile(f)]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2048,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train(files, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    fast.save_pretrained(out)
    cfg = LlamaConfig(
        vocab_size=len(fast), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=2048,
        bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)


def build_noisy_copy(src: str, dst: str, scale: float) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst, dirs_exist_ok=True)
    g = torch.Generator().manual_seed(123)
    noisy = {}
    for name, w in load_file(f"{src}/model.safetensors").items():
        if scale > 0 and w.numel() > 1:
            w32 = w.float()
            w = (w32 + scale * w32.std() * torch.randn(w.shape, generator=g)).to(w.dtype)
        noisy[name] = w
    save_file(noisy, f"{dst}/model.safetensors", metadata={"format": "pt"})


def build_unsupported_draft(src: str, dst: str) -> None:
    """A small draft with head_dim 16: /health answers, the first request kills the engine
    ("Unsupported CPU attention configuration", reference/vllm-cpu.md §3)."""
    import torch
    from transformers import AutoConfig, LlamaForCausalLM

    shutil.copytree(src, dst, dirs_exist_ok=True)
    os.remove(os.path.join(dst, "model.safetensors"))
    cfg = AutoConfig.from_pretrained(src)
    cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers = 64, 128, 1
    cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim = 4, 2, 16
    torch.manual_seed(1)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(dst)


def build_bigram(src: str, dst: str) -> None:
    """The target's tokenizer and shape, with weights set by hand so that the next token is a
    fixed function of the current one: a cycle through the vocabulary's whole-word tokens
    (``chain.json``, in order). Attention and MLP outputs are zero, so the residual stream is the
    current token's embedding, and the LM head row of ``next(t)`` is ``t``'s embedding.

    Such a model continues a list it was shown — what n-gram speculation bets on — and nothing
    else, so prompts holding the chain ahead accept every n-gram draft and prompts holding the
    same words shuffled accept almost none (the engine test's two categories)."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM

    shutil.copytree(src, dst, dirs_exist_ok=True)
    os.remove(os.path.join(dst, "model.safetensors"))
    tok = AutoTokenizer.from_pretrained(src)
    words = [
        i
        for t, i in sorted(tok.get_vocab().items(), key=lambda x: x[1])
        if len(t) > 3 and t[0] == "\u0120" and t[1:].isalpha() and t[1:].islower()
        and tok.encode(tok.decode([i]), add_special_tokens=False) == [i]
    ]  # fmt: skip
    random.Random(7).shuffle(words)
    successor = {w: words[(n + 1) % len(words)] for n, w in enumerate(words)}
    model = LlamaForCausalLM(AutoConfig.from_pretrained(src))
    torch.manual_seed(2)
    with torch.no_grad():
        emb = torch.randn(model.config.vocab_size, model.config.hidden_size)
        model.model.embed_tokens.weight.copy_(emb)
        head = torch.zeros_like(emb)  # a token outside the chain: to the nearest chain word
        for w, nxt in successor.items():
            head[nxt] = emb[w] / emb[w].norm() * 8
        model.lm_head.weight.copy_(head)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    model.to(torch.bfloat16).save_pretrained(dst)
    with open(os.path.join(dst, "chain.json"), "w") as f:
        json.dump([tok.decode([w]) for w in words], f)


def main(out: str) -> None:
    target = os.path.join(out, "target")
    if not os.path.exists(os.path.join(target, "model.safetensors")):
        build_target(target)
    for scale in NOISE_LEVELS:
        dst = os.path.join(out, f"draft-noise-{round(scale * 100)}")
        if not os.path.exists(os.path.join(dst, "model.safetensors")):
            build_noisy_copy(target, dst, scale)
    bigram = os.path.join(out, "bigram")
    if not os.path.exists(os.path.join(bigram, "chain.json")):
        build_bigram(target, bigram)
    unsupported = os.path.join(out, "draft-headdim-16")
    if not os.path.exists(os.path.join(unsupported, "model.safetensors")):
        build_unsupported_draft(target, unsupported)


if __name__ == "__main__":
    main(sys.argv[1])
