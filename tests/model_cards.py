"""Real model cards' config.json values, for random-weight models of each routed family built offline.

Each dict is the config.json of the named hub model as published (the keys transformers reads; `architectures`,
`torch_dtype` and `transformers_version` left out). `tiny(name)` keeps every key and the architecture class and
shrinks only the sizes, so a test builds the real family in milliseconds: its norms, fused projections, rope
scaling and sliding window as the real model has them (a window longer than the test's tokens is shortened, so
the sliding mask is exercised).
"""

from __future__ import annotations

import torch

CARDS = {
    "Qwen/Qwen3-0.6B": {
        "model_type": "qwen3", "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
        "initializer_range": 0.02, "intermediate_size": 3072, "max_position_embeddings": 40960,
        "max_window_layers": 28, "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
        "tie_word_embeddings": True, "use_cache": True, "use_sliding_window": False, "vocab_size": 151936},
    "meta-llama/Llama-3.2-1B-Instruct": {
        "model_type": "llama", "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009], "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048,
        "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072,
        "mlp_bias": False, "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
        "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": True, "use_cache": True, "vocab_size": 128256},
    "microsoft/Phi-3-mini-4k-instruct": {
        "model_type": "phi3", "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1,
        "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu", "hidden_size": 3072,
        "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 4096,
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
        "original_max_position_embeddings": 4096, "pad_token_id": 32000, "resid_pdrop": 0.0,
        "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000.0, "sliding_window": 2047,
        "tie_word_embeddings": False, "use_cache": True, "vocab_size": 32064},
    "mistralai/Mistral-7B-Instruct-v0.3": {
        "model_type": "mistral", "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
        "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
        "max_position_embeddings": 32768, "num_attention_heads": 32, "num_hidden_layers": 32,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": None,
        "tie_word_embeddings": False, "use_cache": True, "vocab_size": 32768},
    "mistralai/Mistral-7B-v0.1": {  # the first Mistral: a 4096-token sliding window in every layer
        "model_type": "mistral", "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096,
        "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 32768,
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": False, "use_cache": True,
        "vocab_size": 32000},
}
VOCAB, WINDOW = 97, 5  # test sizes: a small vocabulary, a window shorter than the test prompts


def tiny(name: str, layers: int = 4):
    """The card's config with small sizes: hidden 32, 4 heads (2 KV heads where the card groups them), `layers`."""
    from transformers import CONFIG_MAPPING

    card = dict(CARDS[name])
    grouped = card["num_key_value_heads"] < card["num_attention_heads"]
    card.update(hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
                num_key_value_heads=2 if grouped else 4, vocab_size=VOCAB, bos_token_id=1, eos_token_id=2,
                max_position_embeddings=min(card["max_position_embeddings"], 16384))
    if "pad_token_id" in card:
        card["pad_token_id"] = 0
    if "head_dim" in card:
        card["head_dim"] = 8
    if card.get("sliding_window"):
        card["sliding_window"] = WINDOW
    if "max_window_layers" in card:
        card["max_window_layers"] = layers
    return CONFIG_MAPPING[card.pop("model_type")](**card)


def build(name: str, layers: int = 4, seed: int = 0):
    """A random-weight causal LM of the card's family, its weights scaled so every sub-layer matters."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny(name, layers)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(8.0)
    return model
