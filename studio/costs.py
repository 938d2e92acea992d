""""Why this speed" and "Where it would pay": the engine's cost model (`via_sd.cost.model`) applied to the
session's last run, drawn by `viz.costs`. Nothing here prices anything itself: the profile comes
with the trace (measured on this machine by the engine), and every prediction is `via_sd.cost.model`'s.
"""

from __future__ import annotations

import statistics

import gradio as gr

import viz.costs as draw
from viz.page import plural

try:  # the engine's cost model (pure Python)
    from via_sd.cost import model
    from via_sd.cost.model import GPU_CARDS, CostProfile, Rates
except ImportError:  # an engine without one: the panel says so
    model, GPU_CARDS = None, {}

from .models import MODELS
from .runs import is_current, runs_of

MEASURED = "measured"
DEFAULT_C, DEFAULT_S = 0.42, 0.87  # where the sliders sit before a run; a run's own profile moves them (profile_controls)
DEVICE_WORDS = {"cpu": "CPU", "cuda": "GPU", "mps": "Apple GPU"}


DRAFTER_STEPS = {"model": "A drafter step", "lookup": "Prompt lookup", "hybrid": "A model-drafter step",
                 "early-exit": "An early-exit step"}

def profile_choices() -> list[tuple[str, str]]:
    return [("this machine (measured)", MEASURED)] + [(f"{card} GPU roofline", card) for card in GPU_CARDS]


def measured_profile(traces: dict) -> "CostProfile | None":
    """The cost profile the engine recorded with the run (None for a trace made without one)."""
    if model is None:
        return None
    for trace in runs_of(traces).values():
        d = getattr(trace, "costs", None)
        if d:
            try:
                return CostProfile.from_dict(d)
            except ValueError:
                continue
    return None


def acceptance(trace) -> float | None:
    """Per-draft acceptance of a run (via_sd.cost.model.acceptance)."""
    return model.acceptance(trace.rounds) if trace is not None else None


def round_gamma(trace) -> int | None:
    gammas = [r["gamma"] for r in (trace.rounds if trace else []) if isinstance(r.get("gamma"), int)]
    if gammas:
        return int(statistics.median(gammas))
    g = (getattr(trace, "config", None) or {}).get("gamma")
    return g if isinstance(g, int) else None


def _measured_speedups(runs: dict) -> dict:
    tps = {m: (t.summary or {}).get("tokens_per_s") for m, t in runs.items()}
    out = {}
    for a, b in (("via", "ar"), ("sd", "ar"), ("via", "sd")):
        if tps.get(a) and tps.get(b):
            out[f"{a}_vs_{b}"] = tps[a] / tps[b]
    return out


def device_word(runs: dict) -> str:
    dev = str(next((getattr(t, "device", "") for t in runs.values()), "")).split(":")[0]
    return DEVICE_WORDS.get(dev, dev or "machine")


def panel_info(traces: dict) -> dict | None:
    """The numbers of the "Why this speed" panel (None without a recorded profile)."""
    runs, profile = runs_of(traces), measured_profile(traces)
    if profile is None:
        return None
    sd, via = runs.get("sd"), runs.get("via")
    g = round_gamma(sd or via) or 1
    alpha = acceptance(sd) if sd is not None else acceptance(via)
    kind = ((sd or via).models or {}).get("drafter_kind", "model") if (sd or via) is not None else "model"
    info = {"device": device_word(runs), "source": profile.source, "gamma": g, "alpha": alpha, "c": profile.c,
            "drafter": kind,
            "s": profile.s(g + 1), "V": profile.V(g + 1), "measured": _measured_speedups(runs)}
    if alpha is not None:
        info["E"] = model.expected_emitted(alpha, g)
        info["ceiling"] = model.ceiling(profile, alpha, g)
        info["best_gamma"] = model.best_gamma(profile, "sd", Rates(kept=100 * alpha, trials=100))
    info["predicted"] = model.predict(profile, runs)["speedup"]
    if via is not None:
        n = max(len(via.tokens), 1)
        counts = (via.summary or {}).get("tier_counts") or {}
        info["tiers"] = {t: counts.get(t, 0) / n for t in ("draft", "slim", "full")}
        info["full_calls"], info["rounds"] = (via.summary or {}).get("full_calls", 0), len(via.rounds)
    reader = sd or via or runs.get("ar")
    if reader is not None:
        info["prompt"] = prompt_read(reader, profile)
    info["sentences"] = sentences(info)
    return info


def prompt_read(trace, profile) -> dict:
    """The prompt's tokens, those the chat opening held (read once per pair: via_sd.core.opening), and the share of the
    run's priced forwards that read the prompt."""
    calls = [c for r in trace.rounds for c in r.get("calls", [])]
    total = sum(model.call_ms(profile, c) for c in calls)
    read = sum(model.call_ms(profile, c) for c in calls if model.reads_prompt(c))
    summary = trace.summary or {}
    return {"method": trace.method.upper() if trace.method != "via" else "VIA-SD",
            "tokens": summary.get("prompt_tokens", 0), "opening": summary.get("opening_tokens", 0),
            "share": read / total if total else None}


def sentences(info: dict) -> list[str]:
    g, V, dev = info["gamma"], info["V"], info["device"]
    out = [f"Checking {plural(g, 'draft')} (one pass over {plural(g + 1, 'token')}) costs {V:.1f} one-token "
           f"passes on this {dev} (on a GPU it costs about 1)"
           + (f", so at this acceptance ({info['alpha']:.2f}) rounds of {plural(info['best_gamma'], 'draft')} "
              f"pay best here." if info.get("best_gamma") else ".")]
    drafter = DRAFTER_STEPS.get(info.get("drafter"), DRAFTER_STEPS["model"])
    if info.get("drafter") in ("lookup", "early-exit"):
        out.append(f"{drafter} costs c = {info['c']:.3f} of a verifier pass per drafted token" + (
            " (a search in the text, no model), so a round's cost is almost only its check" if
            info["drafter"] == "lookup" else " (its layers are the verifier's, and so is their cache)") + ".")
    if "tiers" in info:
        out.append(f"{drafter} costs {info['c']:.2f} of a verifier pass and a slim pass {info['s']:.2f} of a "
                   f"full one, so VIA-SD gains over SD only where it skips the full model: it called it in "
                   f"{info['full_calls']} of {plural(info['rounds'], 'round')}.")
    read = info.get("prompt")
    if read and read["share"] is not None and read["tokens"]:
        held = (f" (the chat template's {plural(read['opening'], 'token')} before them are read once for all runs)"
                if read["opening"] else "")
        out.append(f"Reading this prompt's {plural(read['tokens'] - read['opening'], 'token')} was "
                   f"{read['share']:.0%} of this {read['method']} run's cost{held}; the drafter reads them too, so a "
                   f"short reply gains least from speculation.")
    return out


def panel_after_run(traces: dict, theme: str = "light", request: gr.Request = None):
    """The "Why this speed" panel and its cost curve. Returns (panel HTML, figure)."""
    if not is_current(traces, request):
        return gr.skip(), gr.skip()
    return panel(traces), curve(traces, theme)


def panel(traces: dict) -> str:
    if not runs_of(traces):
        return draw.EMPTY
    info = panel_info(traces)
    if info is None:
        return draw.cost_message_html("This trace carries no cost profile (it was recorded by an engine without "
                                      "one), so there is nothing to explain it with.")
    return draw.cost_panel_html(info)


def curve(traces: dict, theme: str = "light"):
    runs, profile = runs_of(traces), measured_profile(traces)
    if profile is None:
        return None
    ks = list(range(1, len(profile.verify_ms) + 1))
    return draw.cost_curve_figure(ks, [profile.V(k) for k in ks], [profile.s(k) for k in ks], profile.c,
                                  round_gamma(runs.get("sd") or runs.get("via")), f"this {device_word(runs)}",
                                  theme if theme in ("light", "dark") else "light")


# ---- where it would pay: a projection -----------------------------------------------------------

def _weight_bytes(config, per: int = 2) -> tuple[int, dict]:
    """A decoder's weight bytes at `per` bytes a weight (bf16 on a GPU), and each sub-layer's."""
    h, n = config.hidden_size, config.num_hidden_layers
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    hd = getattr(config, "head_dim", None) or h // heads
    attn, mlp = per * (2 * h * heads * hd + 2 * h * kv * hd), per * 3 * h * config.intermediate_size
    embed = per * config.vocab_size * h * (1 if getattr(config, "tie_word_embeddings", False) else 2)
    return n * (attn + mlp) + embed, {"attn": attn, "mlp": mlp}


def base_profile(traces: dict, name: str) -> "tuple[CostProfile | None, str]":
    """(profile, label) of a named profile: this machine's measured one, or a card's roofline built from the
    loaded pair's weight bytes (bf16) and its slim route."""
    measured = measured_profile(traces)
    if name not in GPU_CARDS:
        return measured, f"this {device_word(runs_of(traces))}, as measured"
    pair = MODELS.loaded((traces or {}).get("preset"))
    if pair is None:
        return None, f"{name} roofline (needs the loaded pair's sizes)"
    d_bytes, _ = _weight_bytes(pair.drafter.config)
    v_bytes, sub = _weight_bytes(pair.verifier.config)
    route = MODELS.default_route(traces["preset"]) or pair.route
    skipped = sum(sub[s.split(".")[0]] for s in route.skip if s.split(".")[0] in sub)
    layers = (pair.drafter.config.num_hidden_layers, pair.verifier.config.num_hidden_layers)
    return model.roofline(name, d_bytes, v_bytes, 1 - skipped / v_bytes, layers=layers), f"an {name} GPU (roofline)"


def profile_controls(traces: dict, name: str = MEASURED, request: gr.Request = None):
    """The projection's sliders set to a profile's own shape: (flatness 0, c, s)."""
    if not is_current(traces, request):
        return gr.skip(), gr.skip(), gr.skip()
    profile, _ = base_profile(traces, name)
    if profile is None:
        return gr.skip(), gr.skip(), gr.skip()
    g = round_gamma(runs_of(traces).get("sd")) or 1
    return 0.0, round(min(max(profile.c, 0.01), 1.0), 2), round(min(max(profile.s(g + 1), 0.1), 1.0), 2)


def projection(traces: dict, name: str = MEASURED, flatness=0.0, c=None, s=None) -> str:
    """This run's recorded rounds re-priced under the chosen profile, re-shaped by the sliders."""
    runs = runs_of(traces)
    if not runs:
        return draw.PROJECTION_EMPTY
    base, label = base_profile(traces, name)
    if base is None:
        return draw.cost_message_html(f"No cost profile for {label}: the projection needs a run recorded with one.")
    num = lambda x: float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None  # noqa: E731
    profile = model.scaled(base, flatness=num(flatness) or 0.0, c=num(c), s=num(s))
    predicted = model.predict(profile, runs)
    g = round_gamma(runs.get("sd") or runs.get("via")) or 1
    sp = predicted["speedup"]
    sentence = (f"On {label}, checking {plural(g, 'draft')} would cost {profile.V(g + 1):.2f} one-token passes "
                "(projection)"
                + (f", and this run's rounds would make VIA-SD {sp['via_vs_ar']:.2f}× as fast as AR (projection)."
                   if sp.get("via_vs_ar") else "."))
    return draw.projection_html({"label": label, "tokens_per_s": {m: v for m, v in predicted["tokens_per_s"].items()
                                                                 if v}, "speedup": sp, "V": profile.V(g + 1),
                                 "c": profile.c, "s": profile.s(g + 1), "sentence": sentence})
