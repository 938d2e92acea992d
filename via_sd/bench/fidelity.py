"""Fidelity: how closely an output follows the full verifier (VIA-SD is lossy, plain SD is not).

The full verifier reads the prompt once (past the pair's cached chat opening, as decoding does: opening.py),
then each output teacher-forced in passes of CHUNK rows over that
cache (a stop asked for between passes ends it), and scores every emitted token:
    agreement     share of emitted tokens equal to the full model's argmax at that position
    mean_logprob  mean log q(token) of the emitted tokens under the full model
Against an autoregressive reference, `logprob_delta` = mean_logprob - the reference's (0 or
below: greedy AR output is what the full model itself prefers token by token).
"""

from __future__ import annotations

import torch

from ..core.decoding import verifier_cache
from ..weights.row_attention import reading_prompt


CHUNK = 16  # output rows per pass: a stop asked for between two passes is seen within ~0.3-1 s on a 2-core CPU


@torch.inference_mode()
def score_outputs(pair, prompt_ids: list[int], outputs: list[list[int]], stop=None,
                  reuse_opening: bool = True) -> list[dict] | None:
    """Full-verifier agreement and mean log-probability of each output continuing `prompt_ids`, the prompt read
    once for all of them (past the cached chat opening unless `reuse_opening` is False, as the decode did).
    Returns None when `stop()` turned true between two passes (nothing half-scored)."""
    # read as decoding reads it: from the pair's cached chat opening, the rest of the prompt alone (as AR's first
    # call), then each output over that cache in passes that extend it (with row attention bit for bit AR's
    # one-token steps, so greedy AR and SD output agree exactly, however the output is split into passes)
    if not any(outputs):
        return [_score([], None) for _ in outputs]
    full = verifier_cache(pair, prompt_ids, reuse_opening)
    prompt, seq = len(prompt_ids), list(prompt_ids)
    with reading_prompt():
        first = full.logits(seq, prompt, 1)
    scored = []
    for token_ids in outputs:
        full.rollback(prompt)  # back to the prompt alone
        parts, fed = [first], seq + list(token_ids[:-1])
        for at in range(prompt, len(fed), CHUNK):
            if stop is not None and stop():
                return None
            rows = min(CHUNK, len(fed) - at)
            parts.append(full.logits(fed, at + rows, rows).to(first.device))
        scored.append(_score(token_ids, torch.cat(parts)[: len(token_ids)]))
    return scored


def score_output(pair, prompt_ids: list[int], token_ids: list[int]) -> dict:
    """Full-verifier agreement and mean log-probability of `token_ids` continuing `prompt_ids`."""
    return score_outputs(pair, prompt_ids, [token_ids])[0]


def _score(token_ids: list[int], logits) -> dict:
    n = len(token_ids)
    if n == 0:
        return {"tokens": 0, "agreeing": 0, "agreement": None, "mean_logprob": None, "first_disagreement": None}
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
    return measure_fidelities(pair, {"trace": trace}, reference)["trace"]


def measure_fidelities(pair, traces: dict, reference=None, stop=None) -> dict | None:
    """measure_fidelity of each of `traces` ({name: trace}, one prompt), the prompt read once and the
    reference scored once. Returns {name: fidelity}, or None when `stop()` turned true midway."""
    fields = {name: _fields(t) for name, t in traces.items()}
    prompt, config, _, _ = next(iter(fields.values()))
    for p, c, _, models in fields.values():
        if models.get("verifier") and models["verifier"] != pair.verifier_name:
            raise ValueError(f"the trace was decoded with verifier {models['verifier']!r}, not {pair.verifier_name!r}: "
                             "fidelity is only meaningful against the verifier that decoded it")
        if (p, c.get("chat", True)) != (prompt, config.get("chat", True)):
            raise ValueError("the traces decoded different prompts")
        if c.get("reuse_opening", True) != config.get("reuse_opening", True):
            raise ValueError("the traces read their prompt differently (reuse_opening): score them apart")
    outputs = [list(f[2]) for f in fields.values()]
    if reference is not None:
        ref_prompt, ref_config, ref_ids, _ = _fields(reference)
        if ref_prompt != prompt or ref_config.get("chat", True) != config.get("chat", True):
            raise ValueError("the reference trace decoded a different prompt")
        outputs.append(list(ref_ids))
    scores = score_outputs(pair, pair.encode(prompt, chat=config.get("chat", True)), outputs, stop,
                           reuse_opening=config.get("reuse_opening", True))
    if scores is None:
        return None
    result = dict(zip(fields, scores))
    if reference is not None:
        ref = scores[-1]
        for name, out in result.items():
            token_ids = fields[name][2]
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
    return result
