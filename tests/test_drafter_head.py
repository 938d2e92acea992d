"""The cheaper drafter: a frequency-ranked output head (FR-Spec) over a shipped token list, fused int4
matmuls; on the embedded pair it is the default drafter (tests/embedded/test_long_runs.py: greedy SD still
equals greedy AR over 300 tokens)."""

import json

import torch

from via_sd.weights.heads import FrequentHead
from via_sd.weights.settings import Int4Linear
from via_sd.weights.build import FREQUENT, TOKEN_FREQ, frequent_ids


def test_a_frequent_head_scores_its_tokens_as_the_whole_head_does_and_no_other():
    torch.manual_seed(0)
    head = Int4Linear.from_float(torch.randn(512, 64) * 0.1, torch.randn(512))
    ids = torch.randperm(512, generator=torch.Generator().manual_seed(1))[:48]
    narrow = FrequentHead(head, ids)
    h = torch.randn(5, 64)
    with torch.inference_mode():
        full, logits = head(h), narrow(h)
    kept = torch.zeros(512, dtype=torch.bool)
    kept[ids] = True
    assert logits.shape == full.shape and narrow.out_features == 512
    assert torch.equal(logits[:, kept], full[:, kept])  # the same codes, bit for bit
    assert (logits[:, ~kept] == torch.finfo(torch.float32).min).all()
    assert kept[logits.argmax(-1)].all() and (logits.softmax(-1)[:, ~kept] == 0).all()


def test_tokens_of_the_context_join_the_frequent_head_until_the_next_prompt():
    """A reply echoes its prompt: a token the drafter was fed is scored even when the list lacks it."""
    from transformers import DynamicCache

    model = __import__("test_weights").tiny_int4_llama()
    full = model.lm_head
    narrow = FrequentHead(full, torch.arange(0, 128, 2))  # even ids only
    model.lm_head = narrow
    narrow.watch(model)
    prompt = torch.tensor([[2, 4, 7, 9]])  # 7 and 9 are odd: outside the list
    with torch.inference_mode():
        cache = DynamicCache()
        logits = model(prompt, past_key_values=cache).logits
        h = model.model(prompt).last_hidden_state
        scored = torch.isfinite(logits[0, -1]) & (logits[0, -1] > torch.finfo(torch.float32).min)
        assert set(scored.nonzero().flatten().tolist()) == set(range(0, 128, 2)) | {7, 9}
        assert torch.equal(logits[0, -1, [7, 9]], full(h)[0, -1, [7, 9]])
        model(torch.tensor([[11]]), past_key_values=cache)  # fed later: joins too
        assert 11 in narrow.context_ids.tolist()
        model(torch.tensor([[4, 6]]), past_key_values=DynamicCache())  # a new prompt: forgotten
    assert narrow.context_ids is None


def test_the_shipped_token_list_is_small_ranked_and_keeps_the_special_tokens():
    table = json.loads(TOKEN_FREQ.read_text())
    assert TOKEN_FREQ.stat().st_size < 1_000_000 and "build_token_freq.py" in table["command"]
    ids = table["ids"]
    assert len(set(ids)) == len(ids) and all(0 <= i < table["vocab_size"] for i in ids)
    assert {151643, 151644, 151645} <= set(table["special_ids"])  # <|endoftext|>, <|im_start|>, <|im_end|>

    class Qwen2:
        model_type, vocab_size = "qwen2", 151936

    chosen = frequent_ids(Qwen2, FREQUENT)
    assert len(chosen) % 16 == 0 and FREQUENT <= len(chosen) < FREQUENT + 16 + len(table["special_ids"])
    assert set(ids[:FREQUENT]) <= set(chosen.tolist()) and 151645 in chosen.tolist()

    class Llama:
        model_type, vocab_size = "llama", 32000

    assert frequent_ids(Llama, FREQUENT) is None  # another vocabulary keeps its whole head


