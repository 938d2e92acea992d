"""Render every viz figure and the colored tokens to PNG, to look at them.

    .venv/bin/python scripts/render_figures.py [--out artifacts/figures] [--themes light,dark]
                                               [--source tiny|embedded|sample] [--max-new-tokens 48]

Traces come from the engine (`--source tiny`: the tiny random pair with a routed slim verifier,
the default when via_sd imports; `embedded`: the real embedded pair, slow on CPU) or from
`viz.sample` (`--source sample`: hand-built, no model). Figures are drawn by Debian's Chromium
through Playwright's Python package (no `playwright install`): each figure is written as HTML next
to one shared plotly.min.js and screenshotted once its `.plotly` element exists.

Files (per theme T): tokens_T.png, confidence_via_T.png, confidence_via_draft_signal_T.png,
confidence_sd_T.png, confidence_what_if_T.png, latency_T.png, speedup_T.png, tier_mix_T.png,
acceptance_by_position_T.png, frontier_T.png.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import viz  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
PAGE_BG = {"light": "#FFFFFF", "dark": "#0B0F19"}  # Gradio's light / dark page backgrounds
PAGE_FG = {"light": "#1F2937", "dark": "#E5E7EB"}
WIDTH = 1200
PROMPT = "def fibonacci(n):"


# ---- traces --------------------------------------------------------------------------------------

def _fidelity(pair, trace) -> float:
    """Share of emitted tokens that are the full model's greedy choice, teacher-forced on the output."""
    import torch

    prompt_ids = pair.encode(trace.prompt, chat=trace.config.get("chat", True))
    ids = torch.tensor([prompt_ids + list(trace.token_ids)], device=pair.slim.device)
    with torch.inference_mode():
        logits = pair.verifier(input_ids=ids).logits[0, len(prompt_ids) - 1:-1, : pair.vocab_size]
    top = logits.argmax(-1).tolist()
    return sum(a == b for a, b in zip(top, trace.token_ids)) / max(len(trace.token_ids), 1)


def engine_traces(source: str, max_new_tokens: int, sweep: bool):
    from via_sd import DecodeConfig, Thresholds, generate, load_pair, tiny_random_pair

    if source == "embedded":
        pair = load_pair("embedded")
    else:  # a slim verifier that really differs from the full one
        pair = tiny_random_pair(seed=0, route=["attn.1", "mlp.2"])

    def run(method, accept=0.6, escalate=0.2, signal="slim"):
        cfg = DecodeConfig(gamma=4, max_new_tokens=max_new_tokens,
                           thresholds=Thresholds(accept=accept, escalate=escalate, signal=signal))
        return generate(pair, PROMPT, method=method, config=cfg)

    run("ar")  # warm-up, so the first timed run is not the slowest
    traces = {"ar": run("ar"), "sd": run("sd"), "via": run("via"), "via_draft": run("via", signal="draft")}
    points = []
    if sweep:
        base = traces["ar"].summary["tokens_per_s"]
        for signal in ("slim", "draft"):
            for accept in (0.4, 0.6, 0.8, 0.95):
                for escalate in (0.05, 0.2, 0.35):
                    if escalate > accept:
                        continue
                    t = run("via", accept, escalate, signal)
                    points.append({"accept": accept, "escalate": escalate, "signal": signal,
                                   "speedup": t.summary["tokens_per_s"] / base, "fidelity": _fidelity(pair, t),
                                   "tokens_per_s": t.summary["tokens_per_s"]})
        points.append({"method": "sd", "speedup": traces["sd"].summary["tokens_per_s"] / base,
                       "fidelity": _fidelity(pair, traces["sd"])})
    return traces, points


def sample_traces_and_sweep():
    from viz.sample import sample_trace

    traces = {"ar": sample_trace("ar"), "sd": sample_trace("sd"), "via": sample_trace("via"),
              "via_draft": sample_trace("via", signal="draft")}
    points = []
    for signal in ("slim", "draft"):
        for accept in (0.4, 0.6, 0.8, 0.95):
            for escalate in (0.05, 0.2, 0.35):
                if escalate <= accept:
                    points.append({"accept": accept, "escalate": escalate, "signal": signal,
                                   "speedup": 1.2 + 1.4 * (1 - accept) + 0.6 * (0.3 - escalate)
                                   + 0.1 * (signal == "draft"),
                                   "fidelity": 0.72 + 0.25 * accept * (0.6 + escalate)})
    points.append({"method": "sd", "speedup": 1.9, "fidelity": 1.0})
    return traces, points


# ---- rendering -----------------------------------------------------------------------------------

def figures(traces: dict, sweep: list, theme: str) -> dict:
    via, sd, ar, via_draft = traces["via"], traces["sd"], traces["ar"], traces["via_draft"]
    th = via.config["thresholds"]
    return {
        "confidence_via": viz.confidence_figure(via, theme=theme),
        "confidence_via_draft_signal": viz.confidence_figure(via_draft, theme=theme),
        "confidence_sd": viz.confidence_figure(sd, theme=theme),
        "confidence_what_if": viz.confidence_figure(via, thresholds={"accept": 0.5, "escalate": 0.1}, theme=theme),
        "latency": viz.latency_figure([via, sd, ar], theme=theme),
        "speedup": viz.speedup_figure([ar, sd, via], theme=theme),
        "tier_mix": viz.tier_mix_figure([via, via_draft, sd, ar], theme=theme),
        "acceptance_by_position": viz.acceptance_by_position_figure([via, via_draft, sd], theme=theme),
        "frontier": viz.frontier_figure(sweep, current=th, theme=theme),
    }


def tokens_page(traces: dict, theme: str) -> str:
    from viz.sample import sample_trace

    parts = []
    shown = [("via", "VIA-SD", traces["via"]), ("via_draft", "VIA-SD (draft signal)", traces["via_draft"]),
             ("sd", "SD", traces["sd"]), ("ar", "AR", traces["ar"]),
             ("sample", "hand-built sample: newlines, tabs, leading spaces, HTML", sample_trace("via", seed=4))]
    for key, title, t in shown:
        parts.append(f"<h3>{html.escape(title)} · {len(t.tokens)} tokens</h3>{viz.token_html(t)}")
    return "".join(parts)


def page(body: str, theme: str, script: bool) -> str:
    js = '<script src="plotly.min.js"></script>' if script else ""
    return (f"<!doctype html><html><head><meta charset='utf-8'>{js}<style>body{{margin:0;padding:12px;"
            f"background:{PAGE_BG[theme]};color:{PAGE_FG[theme]};font-family:system-ui,sans-serif;width:{WIDTH}px}}"
            f"h3{{margin:10px 0 2px 0;font-size:19px}}</style></head><body>{body}</body></html>")


def render(traces: dict, sweep: list, out: Path, themes: list[str]) -> list[Path]:
    from playwright.sync_api import sync_playwright
    import plotly.offline

    out.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        tmp = Path(tmp)
        (tmp / "plotly.min.js").write_text(plotly.offline.get_plotlyjs(), encoding="utf-8")
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        pg = browser.new_page(viewport={"width": WIDTH + 24, "height": 700}, device_scale_factor=1)
        for theme in themes:
            jobs = [(f"tokens_{theme}", page(tokens_page(traces, theme), theme, script=False), None)]
            for name, fig in figures(traces, sweep, theme).items():
                fig.update_layout(width=WIDTH)
                div = fig.to_html(include_plotlyjs=False, full_html=False, config={"displayModeBar": False})
                jobs.append((f"{name}_{theme}", page(div, theme, script=True), ".plotly"))
            for name, doc, selector in jobs:
                path = tmp / f"{name}.html"
                path.write_text(doc, encoding="utf-8")
                pg.goto(path.as_uri())
                if selector:
                    pg.wait_for_selector(selector, timeout=20000)
                    pg.wait_for_selector(".main-svg", timeout=20000)
                png = out / f"{name}.png"
                pg.locator("body").screenshot(path=str(png))
                written.append(png)
        browser.close()
    return written


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "artifacts" / "figures"))
    ap.add_argument("--themes", default="light,dark")
    ap.add_argument("--source", choices=("auto", "tiny", "embedded", "sample"), default="auto")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--reuse", action="store_true", help="reuse the traces saved in OUT/traces.json last time")
    ap.add_argument("--no-sweep", action="store_true", help="skip the threshold sweep (frontier from samples)")
    args = ap.parse_args(argv)
    if not Path(CHROMIUM).exists():
        print(f"{CHROMIUM} not found: apt-get install chromium", file=sys.stderr)
        return 2
    start = time.time()
    source = args.source
    if source == "auto":
        try:
            import via_sd  # noqa: F401
            source = "tiny"
        except Exception as err:  # noqa: BLE001 - any import failure means: no engine here
            print(f"engine unavailable ({err}); using hand-built sample traces")
            source = "sample"
    cache = Path(args.out) / "traces.json"
    if args.reuse and cache.exists():
        from via_sd.core.trace import Trace

        data = json.loads(cache.read_text(encoding="utf-8"))
        traces = {k: Trace.from_dict(v) for k, v in data["traces"].items()}
        sweep, source = data["sweep"], data["source"] + " (reused)"
    elif source == "sample":
        traces, sweep = sample_traces_and_sweep()
    else:
        traces, sweep = engine_traces(source, args.max_new_tokens, sweep=not args.no_sweep)
        if not sweep:
            sweep = sample_traces_and_sweep()[1]
    Path(args.out).mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"source": source.replace(" (reused)", ""), "sweep": sweep,
                                 "traces": {k: t.to_dict() for k, t in traces.items()}}), encoding="utf-8")
    print(f"traces from {source} in {time.time() - start:.1f}s; rendering")
    written = render(traces, sweep, Path(args.out), [t for t in args.themes.split(",") if t])
    for png in written:
        print(png)
    print(f"{len(written)} PNGs in {time.time() - start:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
