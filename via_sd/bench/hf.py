"""The baseline: transformers' assisted generation (`verifier.generate(assistant_model=drafter)`) on the same pair."""

from __future__ import annotations

import torch

from ..core.decoding import DecodeConfig


@torch.inference_mode()
def generate_hf(pair, prompt: str, config: DecodeConfig) -> tuple[list[int], dict]:
    """transformers' assisted generation on the same pair: gamma drafts per round, fixed.

    Returns (new token ids, forward calls per model). The drafter's generation config is restored.
    """
    gen_cfg = pair.drafter.generation_config
    keys = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
    saved = {k: getattr(gen_cfg, k, None) for k in keys}
    # transformers reads the draft length from the assistant's config; its confidence threshold
    # ends drafting early as the engine's draft_stop does (0 = off)
    if config.auto_gamma:  # transformers' own adaptive draft length stands in for the cost model's
        gen_cfg.num_assistant_tokens, gen_cfg.num_assistant_tokens_schedule = 5, "heuristic"
    else:
        gen_cfg.num_assistant_tokens, gen_cfg.num_assistant_tokens_schedule = config.gamma, "constant"
    gen_cfg.assistant_confidence_threshold = float(getattr(config, "draft_stop", 0.0))
    calls = {"drafter": 0, "full": 0}

    def counter(name):
        def hook(*_):
            calls[name] += 1
        return hook

    hooks = [pair.drafter.register_forward_pre_hook(counter("drafter")),
             pair.verifier.register_forward_pre_hook(counter("full"))]
    try:
        new = _verifier_generate(pair, prompt, config, assistant_model=pair.drafter)
    finally:
        for h in hooks:
            h.remove()
        for k, v in saved.items():
            setattr(gen_cfg, k, v)
    return new, calls


HF_LOOKUP_TOKENS = 5  # transformers' prompt lookup at its best fixed length on the copy prompts (BENCHMARKS.md)


@torch.inference_mode()
def generate_hf_self(pair, prompt: str, method: str, config: DecodeConfig) -> tuple[list[int], dict]:
    """transformers' drafters without a second model, on the verifier: prompt lookup (`prompt_lookup_num_tokens`,
    PromptLookupCandidateGenerator, n-grams up to config.lookup_ngram) or early exit (`assistant_early_exit`,
    EarlyExitCandidateGenerator, the verifier's first config.exit_layer layers: 0 = half). Greedy output equals
    transformers' (and our) AR where the verifier is exact; the bench checks it (`identical_to_ar`)."""
    from ..core.early_exit import exit_layer_of

    calls = {"drafter": 0, "full": 0}
    hook = pair.verifier.register_forward_pre_hook(lambda *_: calls.__setitem__("full", calls["full"] + 1))
    if method == "hf-lookup":
        extra = {"prompt_lookup_num_tokens": HF_LOOKUP_TOKENS, "max_matching_ngram_size": config.lookup_ngram}
    else:
        extra = {"assistant_early_exit": exit_layer_of(config, pair.verifier)}
    try:
        new = _verifier_generate(pair, prompt, config, **extra)
    finally:
        hook.remove()
    return new, calls


def _verifier_generate(pair, prompt: str, config: DecodeConfig, **extra) -> list[int]:
    """transformers' generate on the verifier, greedy or sampled as `config` says; the new token ids."""
    ids = torch.tensor([pair.encode(prompt, chat=config.chat)], device=pair.slim.device)
    eos = sorted(pair.eos_ids)
    pad = pair.tokenizer.pad_token_id if pair.tokenizer.pad_token_id is not None else (eos or [0])[0]
    sampling = {} if config.greedy else {"temperature": config.temperature, "top_p": config.top_p, "top_k": 0}
    if not config.greedy:
        torch.manual_seed(config.seed)
    out = pair.verifier.generate(ids, attention_mask=torch.ones_like(ids), do_sample=not config.greedy,
                                 max_new_tokens=config.max_new_tokens, eos_token_id=eos or None,
                                 pad_token_id=pad, repetition_penalty=1.0, **sampling, **extra)
    new = out[0, ids.shape[1]:].tolist()
    pair.tokenizer.decode(new, skip_special_tokens=True)  # as the engine does, so both pay for the text
    return new
