"""Honest architecture support: for every decoder family the slim verifier accepts, route "none" equals
the verifier's own logits (tiny random configs built offline, the newer families from real model cards' configs:
tests/model_cards.py); skipping a sub-layer changes them; other families are refused at load."""

import pytest
import torch
from transformers import (AutoModelForCausalLM, DynamicCache, Gemma2Config, Gemma3TextConfig, GPT2Config,
                          GraniteConfig, LlamaConfig, MistralConfig, Qwen2Config)

from model_cards import CARDS, WINDOW, tiny
from model_cards import build as build_card
from via_sd.core.routing import FAMILIES, Route, SlimVerifier, resolve_route

SMALL = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256)
CONFIGS = {  # one small config per family; real model cards follow below
    "llama": lambda: LlamaConfig(**SMALL),
    "qwen2": lambda: Qwen2Config(**SMALL),
    "mistral": lambda: MistralConfig(**SMALL, sliding_window=5),
    "gemma2": lambda: Gemma2Config(**SMALL, head_dim=8, sliding_window=5, final_logit_softcapping=3.0,
                                   attn_logit_softcapping=5.0),
    "gemma3_text": lambda: Gemma3TextConfig(**SMALL, head_dim=8, sliding_window=5, final_logit_softcapping=3.0,
                                            layer_types=["sliding_attention", "full_attention"] * 2),
    "granite": lambda: GraniteConfig(**SMALL, embedding_multiplier=3.0, residual_multiplier=0.5,
                                     logits_scaling=4.0, attention_multiplier=0.2),
    "qwen3": lambda: tiny("Qwen/Qwen3-0.6B"),
    "phi3": lambda: tiny("microsoft/Phi-3-mini-4k-instruct"),
}


def build(kind: str):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CONFIGS[kind]()).eval()
    with torch.no_grad():  # random init is near-uniform; larger weights make every sub-layer matter
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(8.0)
    return model


def test_every_accepted_family_is_tested():
    assert set(CONFIGS) == set(FAMILIES)


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_route_none_equals_the_verifier_in_one_pass_and_with_a_cache(kind):
    model = build(kind)
    slim = SlimVerifier(model, resolve_route("none", model.config.num_hidden_layers))
    ids = torch.randint(0, 97, (1, 14), generator=torch.Generator().manual_seed(1))  # longer than the window
    with torch.no_grad():
        full = model(ids).logits
    assert torch.allclose(slim(ids, past_key_values=DynamicCache()).logits, full, atol=1e-4, rtol=1e-4)
    cache = DynamicCache()  # prompt, then one token at a time, then a block: as decoding feeds it
    parts = [slim(ids[:, :6], past_key_values=cache).logits, slim(ids[:, 6:7], past_key_values=cache).logits,
             slim(ids[:, 7:], past_key_values=cache).logits]
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind, extra, neutral", [
    ("gemma2", "_softcap", None), ("gemma3_text", "_softcap", None), ("granite", "_embedding_scale", 1.0),
    ("granite", "_residual_scale", 1.0), ("granite", "_logits_scale", 1.0),
])
def test_each_familys_extra_is_needed_to_match(kind, extra, neutral):
    """Without the family's soft-capping or multipliers the slim verifier would differ from the verifier."""
    model = build(kind)
    slim = SlimVerifier(model, resolve_route("none", model.config.num_hidden_layers))
    setattr(slim, extra, neutral)
    ids = torch.randint(0, 97, (1, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert not torch.allclose(slim(ids, past_key_values=DynamicCache()).logits, model(ids).logits, atol=1e-3)


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_a_routed_slim_verifier_differs_and_decodes_incrementally(kind):
    model = build(kind)
    slim = SlimVerifier(model, resolve_route(["attn.1", "mlp.2"], model.config.num_hidden_layers))
    ids = torch.randint(0, 97, (1, 12), generator=torch.Generator().manual_seed(2))
    one = slim(ids, past_key_values=DynamicCache()).logits
    with torch.no_grad():
        assert not torch.allclose(one, model(ids).logits, atol=1e-3)
    cache = DynamicCache()
    both = torch.cat([slim(ids[:, :7], past_key_values=cache).logits, slim(ids[:, 7:], past_key_values=cache).logits], 1)
    torch.testing.assert_close(both, one, atol=1e-4, rtol=1e-4)


def test_other_families_are_refused_with_a_clear_message():
    model = AutoModelForCausalLM.from_config(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=97)).eval()
    with pytest.raises(ValueError, match="cannot route a 'gpt2' verifier.*llama"):
        SlimVerifier(model, Route("none", (), 2))


# ---- the families of real model cards: random weights, the card's own config keys (tests/model_cards.py) ----

CARD_CLASSES = {"Qwen/Qwen3-0.6B": "Qwen3ForCausalLM", "meta-llama/Llama-3.2-1B-Instruct": "LlamaForCausalLM",
                "microsoft/Phi-3-mini-4k-instruct": "Phi3ForCausalLM",
                "mistralai/Mistral-7B-Instruct-v0.3": "MistralForCausalLM",
                "mistralai/Mistral-7B-v0.1": "MistralForCausalLM"}


def test_each_card_builds_its_real_architecture():
    assert set(CARD_CLASSES) == set(CARDS)
    for name, cls in CARD_CLASSES.items():
        model = build_card(name)
        assert type(model).__name__ == cls and model.config.model_type in FAMILIES
    qwen3 = build_card("Qwen/Qwen3-0.6B").model.layers[1].self_attn
    assert hasattr(qwen3, "q_norm") and hasattr(qwen3, "k_norm")  # Qwen3 normalizes each head's queries and keys
    phi3 = build_card("microsoft/Phi-3-mini-4k-instruct")
    assert hasattr(phi3.model.layers[1].self_attn, "qkv_proj") and hasattr(phi3.model.layers[1].mlp, "gate_up_proj")
    assert phi3.config.sliding_window == WINDOW
    llama3 = build_card("meta-llama/Llama-3.2-1B-Instruct")
    assert llama3.config.rope_parameters["rope_type"] == "llama3"


@pytest.mark.parametrize("name", sorted(CARDS))
def test_a_cards_family_routes_exactly(name):
    """Keeping every sub-layer is the full model (one pass, and cached as decoding feeds it); skipping one attention
    and one MLP sub-layer changes the logits, and the routed slim verifier still decodes incrementally."""
    model = build_card(name)
    n = model.config.num_hidden_layers
    ids = torch.randint(0, 97, (1, 14), generator=torch.Generator().manual_seed(1))  # longer than the window
    with torch.no_grad():
        full = model(ids).logits
    whole = SlimVerifier(model, resolve_route("none", n))
    torch.testing.assert_close(whole(ids, past_key_values=DynamicCache()).logits, full, atol=1e-4, rtol=1e-4)
    cache = DynamicCache()
    parts = [whole(ids[:, :6], past_key_values=cache).logits, whole(ids[:, 6:7], past_key_values=cache).logits,
             whole(ids[:, 7:], past_key_values=cache).logits]
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-4, rtol=1e-4)
    for skip in (["attn.1"], ["mlp.2"]):
        routed = SlimVerifier(model, resolve_route(skip, n))
        one = routed(ids, past_key_values=DynamicCache()).logits
        assert not torch.allclose(one, full, atol=1e-3), f"skipping {skip} changed nothing"
        cache = DynamicCache()
        both = torch.cat([routed(ids[:, :7], past_key_values=cache).logits,
                          routed(ids[:, 7:], past_key_values=cache).logits], 1)
        torch.testing.assert_close(both, one, atol=1e-4, rtol=1e-4)


def test_the_sliding_window_is_needed_to_match_phi3():
    """Phi-3 slides in every layer: read as full attention, the slim verifier would differ from the model."""
    model = build_card("microsoft/Phi-3-mini-4k-instruct")
    slim = SlimVerifier(model, resolve_route("none", model.config.num_hidden_layers))
    slim.layer_types = ["full_attention"] * model.config.num_hidden_layers
    ids = torch.randint(0, 97, (1, 14), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert not torch.allclose(slim(ids, past_key_values=DynamicCache()).logits, model(ids).logits, atol=1e-3)
