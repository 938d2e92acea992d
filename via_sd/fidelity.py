"""Fidelity: how closely an output follows the full verifier (VIA-SD is lossy, plain SD is not).

The full verifier reads the prompt, then the output teacher-forced in one pass over that cache, and
scores every emitted token at once:
    agreement     share of emitted tokens equal to the full model's argmax at that position
    mean_logprob  mean log q(token) of the emitted tokens under the full model
Against an autoregressive reference, `logprob_delta` = mean_logprob - the reference's (0 or
below: greedy AR output is what the full model itself prefers token by token).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


@torch.inference_mode()
def score_output(pair, prompt_ids: list[int], token_ids: list[int]) -> dict:
    """Full-verifier agreement and mean log-probability of `token_ids` continuing `prompt_ids`."""
    n = len(token_ids)
    if n == 0:
        return {"tokens": 0, "agreeing": 0, "agreement": None, "mean_logprob": None, "first_disagreement": None}
    # read as decoding reads it: the prompt alone (as AR's first call), then the output as one pass extending that
    # cache (with row attention bit for bit AR's one-token steps, so greedy AR and SD output agree exactly)
    device, cache = pair.slim.device, DynamicCache()
    first = pair.verifier(input_ids=torch.tensor([list(prompt_ids)], device=device), past_key_values=cache,
                          use_cache=True, logits_to_keep=1).logits[0, -1:]
    parts = [first]
    if n > 1:
        rest = torch.tensor([list(token_ids[:-1])], device=device)
        parts.append(pair.verifier(input_ids=rest, past_key_values=cache, use_cache=True,
                                   logits_to_keep=n - 1).logits[0, -(n - 1):].to(first.device))
    logits = torch.cat(parts)[:, : pair.vocab_size]
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    target = torch.tensor(token_ids, device=logprobs.device)
    agree = logprobs.argmax(-1) == target
    misses = (~agree).nonzero()
    return {
        "tokens": n,
        "agreeing": int(agree.sum()),
        "agreement": float(agree.float().mean()),
        "mean_logprob": float(logprobs.gather(1, target[:, None]).mean()),
        "first_disagreement": int(misses[0, 0]) if len(misses) else None,
    }


def _fields(trace) -> tuple[str, dict, list[int], dict]:
    if isinstance(trace, dict):
        return trace["prompt"], trace.get("config") or {}, trace["token_ids"], trace.get("models") or {}
    return trace.prompt, trace.config or {}, trace.token_ids, trace.models or {}


def measure_fidelity(pair, trace, reference=None) -> dict:
    """Fidelity of a trace (Trace or its dict) to the pair's full verifier.

    Returns {"agreement", "mean_logprob", "tokens", "agreeing", "first_disagreement"}; with an
    autoregressive `reference` trace of the same prompt also "reference_mean_logprob",
    "logprob_delta", "identical" (same tokens) and "common_prefix" (leading tokens in common).
    """
    prompt, config, token_ids, models = _fields(trace)
    if models.get("verifier") and models["verifier"] != pair.verifier_name:
        raise ValueError(f"the trace was decoded with verifier {models['verifier']!r}, not {pair.verifier_name!r}: "
                         "fidelity is only meaningful against the verifier that decoded it")
    prompt_ids = pair.encode(prompt, chat=config.get("chat", True))
    out = score_output(pair, prompt_ids, token_ids)
    if reference is not None:
        ref_prompt, ref_config, ref_ids, _ = _fields(reference)
        if ref_prompt != prompt:
            raise ValueError("the reference trace decoded a different prompt")
        ref = score_output(pair, pair.encode(ref_prompt, chat=ref_config.get("chat", True)), ref_ids)
        common = 0
        for a, b in zip(token_ids, ref_ids):
            if a != b:
                break
            common += 1
        out["reference_mean_logprob"] = ref["mean_logprob"]
        out["logprob_delta"] = (None if out["mean_logprob"] is None or ref["mean_logprob"] is None
                                else out["mean_logprob"] - ref["mean_logprob"])
        out["identical"] = list(token_ids) == list(ref_ids)
        out["common_prefix"] = common
    return out
