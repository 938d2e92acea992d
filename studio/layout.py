"""The page's layout in reading order: one builder per area, each returning the components it creates
(a namespace), for `app.py` to wire. Nothing here handles an event.

Call the builders inside a `gr.Blocks`, in the order they are listed: a component's place on the page
(and its id) is the order it is made in.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import gradio as gr

import via_sd
import viz.page as page

from . import costs, lab, own_pair, recorded, views
from .lab import DEFAULT_THRESHOLD_PRESET
from .batch import BATCH
from .inputs import KNOBS
from .models import LOCK_REASON, MODELS, preset_choices, preset_locked, route_choices
from .runs import runs_of

_PAPER = via_sd.THRESHOLD_PRESETS[DEFAULT_THRESHOLD_PRESET]
DEFAULTS = {"gamma": 0, "accept": _PAPER.accept, "escalate": _PAPER.escalate, "signal": _PAPER.signal,
            "temperature": 0.0, "max_new_tokens": 64, "seed": 0, "with_ar": True, "drafter": "model"}
DRAFTER_CHOICES = [("model drafter", "model"), ("prompt lookup", "lookup"), ("hybrid", "hybrid"),
                   ("early exit", "early-exit")]
INTRO = """# VIA-SD Studio
A small **drafter** proposes tokens, a **slim verifier** (the big model with some sub-layers skipped) settles the
medium-confidence ones, and only uncertain tokens go to the **full model**. Hover a token for its numbers."""


def merge(*parts: SimpleNamespace) -> SimpleNamespace:
    """One namespace of every area's components: a name two areas share is an error, never a silent override."""
    names = [name for part in parts for name in vars(part)]
    shared = sorted({name for name in names if names.count(name) > 1})
    if shared:
        raise ValueError(f"components named twice: {shared}")
    return SimpleNamespace(**{name: c for part in parts for name, c in vars(part).items()})


def session_state(opening: dict | None = None) -> SimpleNamespace:
    """What a session keeps between events: its last run (at first the recorded run the page opens on,
    `studio.recorded`), the run the follow-up steps draw, its tickets, the theme."""
    traces = gr.State(opening or {})  # the session's last run: {method: Trace, "ticket", "preset", "fidelity"}
    settled = gr.State({})  # the run the follow-up steps draw (`runs.settle` hands it on after Done)
    run_ticket, sweep_ticket, route_ticket = gr.State(None), gr.State(None), gr.State(None)
    theme = gr.Textbox(value="light", visible="hidden", elem_id="theme", label="theme (light or dark)")
    return SimpleNamespace(traces=traces, settled=settled, run_ticket=run_ticket, sweep_ticket=sweep_ticket,
                           route_ticket=route_ticket, theme=theme)


def settings_sidebar(preset: str) -> SimpleNamespace:
    """The settings: model preset, the thresholds of the three tiers, the decoding settings, how the page shows."""
    with gr.Sidebar(label="Settings", width=340, elem_id="settings"):
        gr.Markdown("### Settings")
        locked = preset_locked()
        model = gr.Dropdown(preset_choices(), value=preset, label="Model preset", elem_id="preset",
                            interactive=not locked, info=LOCK_REASON.capitalize() if locked else None)
        own = own_pair.panel(visible=not locked)
        threshold_preset = gr.Radio(lab.threshold_preset_choices(), value=DEFAULT_THRESHOLD_PRESET,
                                    label="threshold preset", info=lab.threshold_preset_info(),
                                    elem_id="threshold-preset")
        accept = gr.Slider(0, 1, value=DEFAULTS["accept"], step=0.01, label="accept",
                           info="tier A: confidence ≥ accept keeps the draft, no verifier", elem_id="accept")
        escalate = gr.Slider(0, 1, value=DEFAULTS["escalate"], step=0.01, label="escalate",
                             info="tier C: confidence < escalate asks the full model", elem_id="escalate")
        signal = gr.Radio([("slim verifier r = q′(x)/max q′", "slim"), ("drafter p(x)", "draft")],
                          value=DEFAULTS["signal"], label="whose confidence sorts the tiers", elem_id="signal")
        drafter = gr.Radio(DRAFTER_CHOICES, value=DEFAULTS["drafter"], label="drafter (who proposes the tokens)",
                           info="prompt lookup copies what followed the same words earlier (no model); hybrid uses it "
                           "when it matches, else the model; early exit is the verifier's first layers",
                           elem_id="drafter")
        gamma = gr.Slider(0, 16, value=DEFAULTS["gamma"], step=1, elem_id="gamma",
                          label="gamma (drafts per round; 0 = auto, each round from this machine's costs)")
        max_new_tokens = gr.Slider(8, 512, value=DEFAULTS["max_new_tokens"], step=8, label="max new tokens",
                                   elem_id="max-new-tokens")
        temperature = gr.Slider(0, 2, value=DEFAULTS["temperature"], step=0.05, label="temperature (0 = greedy)",
                                elem_id="temperature")
        seed = gr.Number(value=DEFAULTS["seed"], precision=0, label="seed", elem_id="seed")
        route = gr.Dropdown(route_choices(), value="default", label="slim verifier route", elem_id="route")
        with_ar = gr.Checkbox(DEFAULTS["with_ar"], label="run AR too (the full model alone: the baseline)",
                              elem_id="with-ar")
        presentation = gr.Checkbox(False, label="presentation mode (large type)", elem_id="presentation")
        pace = gr.Slider(0, 1000, value=0, step=50, label="slow motion (ms each step stays on screen)",
                         info="0 = live speed; timings exclude the pauses", elem_id="pace")
    return merge(own, SimpleNamespace(
        model=model, threshold_preset=threshold_preset, accept=accept, escalate=escalate, signal=signal,
        drafter=drafter, gamma=gamma, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, route=route,
        with_ar=with_ar, presentation=presentation, pace=pace))


def prompt_area(preset: str, examples: list[list[str]], labels: list[str],
                opening: dict | None = None) -> SimpleNamespace:
    """The top of the page: the intro, the models' status, the route search, the prompt (at first the recorded
    run's, so Run decodes it live), Run and Stop."""
    # At 1280x800 the three panes are on screen after a run: the examples and the model picker fold away.
    gr.Markdown(INTRO, elem_id="intro")
    device = gr.Markdown(MODELS.status(preset), elem_id="device", label="models and device (Markdown)",
                         show_label=False)
    with gr.Row(visible=False, elem_id="route-search-row") as route_row:
        route_search = gr.Button("Search a better route", elem_id="route-search", size="sm")
        route_search_stop = gr.Button("Stop search", elem_id="route-search-stop", size="sm", variant="stop")
    with gr.Row(equal_height=False):
        with gr.Column(scale=3):
            prompt = gr.Textbox((opening or {}).get("recorded", {}).get("prompt", ""), label="Prompt", lines=3,
                                max_lines=12, elem_id="prompt",
                                placeholder="Ask something, or open the examples below")
            with gr.Accordion("Examples by task", open=False, elem_id="examples-fold"):
                gr.Examples(examples, inputs=[prompt], example_labels=labels, label="Examples by task",
                            cache_examples=False, examples_per_page=12, elem_id="examples")
        with gr.Column(scale=2, min_width=300):
            with gr.Row():
                run = gr.Button("Run", variant="primary", elem_id="run")
                stop = gr.Button("Stop", variant="stop", elem_id="stop")
            first = recorded.label(opening) or ("VIA-SD, plain SD and AR run one after another on the same prompt, "
                                                "so their timings are comparable.")
            status = gr.HTML(page.status_html(first), elem_id="status", label="status message (HTML)")
    return SimpleNamespace(device=device, route_row=route_row, route_search=route_search,
                           route_search_stop=route_search_stop, prompt=prompt, run=run, stop=stop, status=status)


def panes_and_cards(opening: dict | None = None) -> SimpleNamespace:
    """The three methods' tokens side by side, the metric cards, and the race replay (at first: `opening`'s)."""
    shown = opening or {}
    gr.HTML(page.legend_row_html(), elem_id="legend", js_on_load=None)
    with gr.Row(equal_height=False):
        via_pane = gr.HTML(page.pane_html(shown.get("via"), "via"), elem_id="via-tokens", container=True,
                           padding=True,
                           js_on_load=None, label="VIA-SD tokens (HTML)")
        sd_pane = gr.HTML(page.pane_html(shown.get("sd"), "sd"), elem_id="sd-tokens", container=True,
                          padding=True,
                          js_on_load=None, label="plain SD tokens (HTML)")
        ar_pane = gr.HTML(page.pane_html(shown.get("ar"), "ar"), elem_id="ar-tokens", container=True,
                          padding=True,
                          js_on_load=None, visible=DEFAULTS["with_ar"], label="AR tokens (HTML)")
    metrics = gr.HTML(page.metrics_html(runs_of(shown), shown.get("fidelity")), elem_id="metrics", js_on_load=None,
                      label="metric cards (HTML)")
    with gr.Row(equal_height=True, elem_id="race-controls"):
        race = gr.Button("▶ Replay as a race", elem_id="race-replay", scale=0, min_width=220)
        race_speed = gr.Radio(list(zip(("¼×", "½×", "1×", "2×", "4×"), views.RACE_SPEEDS)), value="1",
                              label="race speed (× recorded time)", elem_id="race-speed", scale=1)
    race_view = gr.HTML(page.race_ready_html(list(views.race_traces(shown))), elem_id="race-view", js_on_load=None,
                        label="race frame (HTML)")
    return SimpleNamespace(via_pane=via_pane, sd_pane=sd_pane, ar_pane=ar_pane, metrics=metrics, race=race,
                           race_speed=race_speed, race_view=race_view)


def tabs(opening: dict | None = None) -> SimpleNamespace:
    """The tabs under the panes, in their order on the page."""
    with gr.Tabs(elem_id="tabs"):
        return merge(why_this_speed_tab(), confidence_tab(), latency_tab(), speedup_tab(), threshold_lab_tab(),
                     trace_tab(), learn_tab(opening))


def why_this_speed_tab() -> SimpleNamespace:
    """"Why this speed": the measured cost model, then "where it would pay", a projection on other machines."""
    with gr.Tab("Why this speed", id="tab-costs"):
        cost_panel = gr.HTML(costs.panel({}), elem_id="cost-model", js_on_load=None)
        cost_plot = gr.Plot(label="what a verification pass costs", elem_id="cost-plot", show_label=False)
        gr.Markdown("### Where it would pay: a projection\nRe-prices this run's recorded rounds on another "
                    "machine with the engine's cost model. Nothing runs; every number here is a "
                    "**projection**.")
        with gr.Row():
            profile = gr.Radio(costs.profile_choices(), value=costs.MEASURED, label="cost profile",
                               elem_id="cost-profile", scale=2)
            flatness = gr.Slider(0, 1, value=0, step=0.05, label="how flat verification is",
                                 info="0 = as measured, 1 = checking k drafts costs one pass",
                                 elem_id="cost-flatness")
        with gr.Row():
            drafter_cost = gr.Slider(0.01, 1, value=costs.DEFAULT_C, step=0.01, label="drafter cost c",
                                     info="one drafter step, in verifier passes", elem_id="cost-c")
            slim_cost = gr.Slider(0.1, 1, value=costs.DEFAULT_S, step=0.01, label="slim pass cost s",
                                  info="a slim pass, in full passes", elem_id="cost-s")
        projection = gr.HTML(costs.projection({}, costs.MEASURED, 0, None, None), elem_id="cost-projection",
                             js_on_load=None)
    return SimpleNamespace(cost_panel=cost_panel, cost_plot=cost_plot, profile=profile, flatness=flatness,
                           drafter_cost=drafter_cost, slim_cost=slim_cost, projection=projection)


def confidence_tab() -> SimpleNamespace:
    """Each token's confidence against the thresholds, and which tier produced it."""
    with gr.Tab("Confidence", id="tab-confidence"):
        confidence_plot = gr.Plot(label="confidence vs thresholds", elem_id="confidence-plot", show_label=False)
        tier_mix_plot = gr.Plot(label="who produced each token", elem_id="tier-mix-plot", show_label=False)
    return SimpleNamespace(confidence_plot=confidence_plot, tier_mix_plot=tier_mix_plot)


def latency_tab() -> SimpleNamespace:
    """Each round's latency."""
    with gr.Tab("Latency", id="tab-latency"):
        latency_plot = gr.Plot(label="latency per round", elem_id="latency-plot", show_label=False)
    return SimpleNamespace(latency_plot=latency_plot)


def speedup_tab() -> SimpleNamespace:
    """The speed-ups, and how often a draft is accepted at each position."""
    with gr.Tab("Speed-up", id="tab-speedup"):
        speedup_plot = gr.Plot(label="speed-up", elem_id="speedup-plot", show_label=False)
        position_plot = gr.Plot(label="acceptance by draft position", elem_id="position-plot", show_label=False)
    return SimpleNamespace(speedup_plot=speedup_plot, position_plot=position_plot)


def threshold_lab_tab() -> SimpleNamespace:
    """The threshold lab: the what-if estimate on the recorded drafts, then a measured sweep."""
    with gr.Tab("Threshold lab", id="tab-lab"):
        gr.Markdown("Move **accept** / **escalate** in the settings: the last VIA-SD trace is re-tiered "
                    "at once. That is an **estimate** (its recorded drafts, not a new run). Tick the box "
                    "to re-run for real when you release a slider.")
        rerun = gr.Checkbox(False, label="re-run on release", elem_id="rerun-on-release")
        whatif = gr.HTML(lab.what_if_card({}, DEFAULTS["accept"], DEFAULTS["escalate"], DEFAULTS["signal"]),
                         elem_id="whatif", js_on_load=None, label="what-if estimate card (HTML)")
        whatif_plot = gr.Plot(label="what-if: re-tiered drafts (estimate)", elem_id="whatif-plot",
                              show_label=False)
        presets_plot = gr.Plot(label="what-if: threshold presets (estimate)", elem_id="whatif-presets-plot",
                               show_label=False)
        gr.Markdown("**Measured sweep**: runs plain SD and VIA-SD at every grid point for real on the "
                    "prompt, interleaved (slow on a CPU: keep the grid and max new tokens small).")
        with gr.Row():
            sweep_accepts = gr.Textbox("0.3, 0.6, 0.9", label="accept values", elem_id="sweep-accepts")
            sweep_escalates = gr.Textbox("0.0, 0.2", label="escalate values", elem_id="sweep-escalates")
            sweep = gr.Button("Measure sweep", elem_id="sweep")
        frontier_plot = gr.Plot(label="speed-up vs fidelity", elem_id="frontier-plot", show_label=False)
    return SimpleNamespace(rerun=rerun, whatif=whatif, whatif_plot=whatif_plot, presets_plot=presets_plot,
                           sweep_accepts=sweep_accepts, sweep_escalates=sweep_escalates, sweep=sweep,
                           frontier_plot=frontier_plot)


def trace_tab() -> SimpleNamespace:
    """The emitted tokens as a table, its files to download, and a saved trace to replay."""
    with gr.Tab("Trace", id="tab-trace"):
        with gr.Row():
            trace_method = gr.Radio([("VIA-SD", "via"), ("plain SD", "sd"), ("AR", "ar")], value="via",
                                    label="trace", elem_id="trace-method")
            json_download = gr.DownloadButton("Download JSON", elem_id="trace-download")
            csv_download = gr.DownloadButton("Download CSV", elem_id="trace-csv")
        upload = gr.File(label="Replay a trace: upload a JSON file saved here (no model needed)",
                         file_count="multiple", file_types=[".json"], elem_id="trace-upload")
        table = gr.Dataframe(label="emitted tokens", elem_id="trace-table", interactive=False,
                             max_height=420)
    return SimpleNamespace(trace_method=trace_method, json_download=json_download, csv_download=csv_download,
                           upload=upload, table=table)


def learn_tab(opening: dict | None = None) -> SimpleNamespace:
    """The last run one round at a time: the drafts, the tier of each, and why (at first: `opening`'s)."""
    walked = views.learn_trace(opening or {})
    rounds = len(walked.rounds) if walked else 1
    with gr.Tab("Learn", id="tab-learn"):
        gr.Markdown("Step through the last run one round at a time: what the drafter proposed, which "
                    "tier each draft went to, and why.")
        with gr.Row():
            prev_round = gr.Button("◀ Prev", elem_id="learn-prev", scale=0)
            learn_round = gr.Slider(1, max(rounds, 2), value=1, step=1, label="round", elem_id="learn-round",
                                    scale=4)
            learn_api_round = gr.Number(1, label="round", precision=None, visible=False)
            next_round = gr.Button("Next ▶", elem_id="learn-next", scale=0)
        learn = gr.HTML(views.learn_view(opening or {}), elem_id="learn-view", js_on_load=None,
                        label="learn view of one round (HTML)")
    return SimpleNamespace(prev_round=prev_round, learn_round=learn_round, learn_api_round=learn_api_round,
                           next_round=next_round, learn=learn)


def api_only() -> SimpleNamespace:
    """For scripts and MCP clients (`studio.api`): the numbers behind the page as labelled JSON. Not drawn."""
    with gr.Column(visible=False, elem_id="api-only"):
        compare_trigger = gr.Button("compare", visible=False)
        comparison = gr.JSON(label="comparison (JSON)")  # per method: summary, text, trace; speed-ups, profile
        estimate_trigger = gr.Button("what-if estimate", visible=False)
        # text, not gr.JSON: the trace gate checks size and depth before parsing (and MCP needs a typed input)
        trace_in = gr.Textbox(label="trace (JSON text)")
        estimate = gr.JSON(label="what-if estimate (JSON)")
        # the rest of `via_sd generate`'s settings (the page has no control for them), at DecodeConfig's defaults
        knobs = [gr.Number(KNOBS["top_p"], label="top_p"), gr.Number(KNOBS["draft_stop"], label="draft_stop"),
                 gr.Number(KNOBS["max_unverified"], label="max_unverified"), gr.Checkbox(KNOBS["chat"], label="chat"),
                 gr.Number(KNOBS["lookup_ngram"], label="lookup_ngram"),
                 gr.Number(KNOBS["lookup_tokens"], label="lookup_tokens"),
                 gr.Number(KNOBS["exit_layer"], label="exit_layer")]
        # a batch (/bench) and a measured sweep as numbers (/sweep): prompts x methods or grid points x repeats
        bench_trigger, sweep_trigger = gr.Button("bench", visible=False), gr.Button("sweep", visible=False)
        prompts = gr.JSON(json.dumps(BATCH["prompts"]), label="prompts: a list, or a shipped prompt file's name (JSON)")
        methods = gr.JSON(BATCH["methods"], label="methods (JSON list)")
        repeats, warmup = gr.Number(BATCH["repeats"], label="repeats"), gr.Number(BATCH["warmup"], label="warmup")
        fidelity = gr.Checkbox(BATCH["fidelity"], label="fidelity")
        limit = gr.Number(BATCH["limit"], label="limit (0: every prompt)")
        accepts = gr.JSON(BATCH["accepts"], label="accept values (JSON list)")
        escalates = gr.JSON(BATCH["escalates"], label="escalate values (JSON list)")
        bench_result = gr.JSON(label="bench (JSON)")
        sweep_result = gr.JSON(label="sweep (JSON)")
    return SimpleNamespace(compare_trigger=compare_trigger, comparison=comparison, estimate_trigger=estimate_trigger,
                           trace_in=trace_in, estimate=estimate, knobs=knobs, bench_trigger=bench_trigger,
                           sweep_trigger=sweep_trigger, prompts=prompts, methods=methods, repeats=repeats,
                           warmup=warmup, fidelity=fidelity, limit=limit, accepts=accepts, escalates=escalates,
                           bench_result=bench_result, sweep_result=sweep_result)
