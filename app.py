"""VIA-SD Studio: watch, compare and tune three-tier speculative decoding in the browser.

    python app.py                      # http://127.0.0.1:7860, embedded Qwen2.5-Coder 0.5B -> 1.5B pair
    VIA_SD_PRESET=random python app.py # tiny random pair: instant, gibberish text (mechanics only)
    VIA_SD_MCP=1 python app.py         # also an MCP server at /gradio_api/mcp/ (needs the `mcp` package)

This file is the page: its layout in reading order, then the event wiring. Handlers are plain
functions in `studio/` (the app's runtime: models, sessions, runs, views, lab, costs, api), every piece
of HTML and every figure comes from `viz/`, and decoding is `via_sd`'s; none is re-implemented here.
"""

from __future__ import annotations

from studio.gpu import spaces  # noqa: F401  (first: on ZeroGPU `spaces` must come before torch touches CUDA)

import json
import logging
import os
from pathlib import Path

import gradio as gr

import viz.page as page
from studio import api, costs, lab, runs, views
from studio.downloads import forget_session
from studio.lab import CUSTOM, DEFAULT_THRESHOLD_PRESET
from studio.models import (DEFAULT_PRESET, LOCK_REASON, MODELS, load_preset, poll_status, preset_choices,
                           preset_locked, route_choices)
from studio.views import MAX_UPLOAD_BYTES
import via_sd

ROOT = Path(__file__).resolve().parent
ASSETS = ROOT / "assets"
_PAPER = via_sd.THRESHOLD_PRESETS[DEFAULT_THRESHOLD_PRESET]
DEFAULTS = {"gamma": 0, "accept": _PAPER.accept, "escalate": _PAPER.escalate, "signal": _PAPER.signal,
            "temperature": 0.0, "max_new_tokens": 64, "seed": 0, "with_ar": True}
# One theme check for every event that draws figures: Gradio marks dark mode with body.dark.
THEME_JS = "() => document.body.classList.contains('dark') ? 'dark' : 'light'"
PRESENTATION_JS = "(on) => { document.body.classList.toggle('presentation', !!on); return []; }"
INTRO = """# VIA-SD Studio
A small **drafter** proposes tokens, a **slim verifier** (the big model with some sub-layers skipped) settles the
medium-confidence ones, and only uncertain tokens go to the **full model**. Hover a token for its numbers."""


def example_prompts() -> tuple[list[list[str]], list[str]]:
    """Two prompts per task from assets/prompts/mixed.jsonl, labelled by task."""
    examples, labels = [], []
    path = ASSETS / "prompts" / "mixed.jsonl"
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        if line.strip():
            item = json.loads(line)
            examples.append([item["prompt"]])
            short = item["prompt"].split("\n")[0]
            short = short.removeprefix("Solve step by step: ").removeprefix("Translate the following text ")
            labels.append(f"{item['task']}: {short[:24]}{'…' if len(short) > 24 else ''}")
    return examples, labels


def build_demo(preset: str = DEFAULT_PRESET) -> gr.Blocks:
    examples, labels = example_prompts()
    MODELS.served = preset
    # Gradio copies every served file into its own cache: hourly, drop copies older than an hour
    with gr.Blocks(title="VIA-SD Studio", fill_width=True, delete_cache=(3600, 3600)) as demo:
        traces = gr.State({})  # the session's last run: {method: Trace, "ticket", "preset", "fidelity"}
        settled = gr.State({})  # the run the follow-up steps draw (`runs.settle` hands it on after Done)
        run_ticket, sweep_ticket, route_ticket = gr.State(None), gr.State(None), gr.State(None)
        theme = gr.Textbox(value="light", visible="hidden", elem_id="theme", label="theme (light or dark)")

        with gr.Sidebar(label="Settings", width=340, elem_id="settings"):
            gr.Markdown("### Settings")
            locked = preset_locked()
            model = gr.Dropdown(preset_choices(), value=preset, label="Model preset", elem_id="preset",
                                interactive=not locked, info=LOCK_REASON.capitalize() if locked else None)
            threshold_preset = gr.Radio(lab.threshold_preset_choices(), value=DEFAULT_THRESHOLD_PRESET,
                                        label="threshold preset", info=lab.threshold_preset_info(),
                                        elem_id="threshold-preset")
            accept = gr.Slider(0, 1, value=DEFAULTS["accept"], step=0.01, label="accept",
                               info="tier A: confidence ≥ accept keeps the draft, no verifier", elem_id="accept")
            escalate = gr.Slider(0, 1, value=DEFAULTS["escalate"], step=0.01, label="escalate",
                                 info="tier C: confidence < escalate asks the full model", elem_id="escalate")
            signal = gr.Radio([("slim verifier r = q′(x)/max q′", "slim"), ("drafter p(x)", "draft")],
                              value=DEFAULTS["signal"], label="whose confidence sorts the tiers", elem_id="signal")
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

        # At 1280x800 the three panes are on screen after a run: the examples and the model picker fold away.
        gr.Markdown(INTRO, elem_id="intro")
        device = gr.Markdown(MODELS.status(preset), elem_id="device", label="models and device (Markdown)",
                             show_label=False)
        with gr.Row(visible=False, elem_id="route-search-row") as route_row:
            route_search = gr.Button("Search a better route", elem_id="route-search", size="sm")
            route_search_stop = gr.Button("Stop search", elem_id="route-search-stop", size="sm", variant="stop")
        with gr.Row(equal_height=False):
            with gr.Column(scale=3):
                prompt = gr.Textbox(label="Prompt", lines=3, max_lines=12, elem_id="prompt",
                                    placeholder="Ask something, or open the examples below")
                with gr.Accordion("Examples by task", open=False, elem_id="examples-fold"):
                    gr.Examples(examples, inputs=[prompt], example_labels=labels, label="Examples by task",
                                cache_examples=False, examples_per_page=10, elem_id="examples")
            with gr.Column(scale=2, min_width=300):
                with gr.Row():
                    run = gr.Button("Run", variant="primary", elem_id="run")
                    stop = gr.Button("Stop", variant="stop", elem_id="stop")
                status = gr.HTML(page.status_html("VIA-SD, plain SD and AR run one after another on the same "
                                                  "prompt, so their timings are comparable."), elem_id="status",
                                 label="status message (HTML)")

        gr.HTML(page.legend_row_html(), elem_id="legend", js_on_load=None)
        with gr.Row(equal_height=False):
            via_pane = gr.HTML(page.pane_html(None, "via"), elem_id="via-tokens", container=True, padding=True,
                               js_on_load=None, label="VIA-SD tokens (HTML)")
            sd_pane = gr.HTML(page.pane_html(None, "sd"), elem_id="sd-tokens", container=True, padding=True,
                              js_on_load=None, label="plain SD tokens (HTML)")
            ar_pane = gr.HTML(page.pane_html(None, "ar"), elem_id="ar-tokens", container=True, padding=True,
                              js_on_load=None, visible=DEFAULTS["with_ar"], label="AR tokens (HTML)")
        metrics = gr.HTML(page.metrics_html({}), elem_id="metrics", js_on_load=None, label="metric cards (HTML)")
        with gr.Row(equal_height=True, elem_id="race-controls"):
            race = gr.Button("▶ Replay as a race", elem_id="race-replay", scale=0, min_width=220)
            race_speed = gr.Radio([("¼×", 0.25), ("½×", 0.5), ("1×", 1.0), ("2×", 2.0), ("4×", 4.0)], value=1.0,
                                  label="race speed (× recorded time)", elem_id="race-speed", scale=1)
        race_view = gr.HTML(page.RACE_HINT, elem_id="race-view", js_on_load=None, label="race frame (HTML)")

        with gr.Tabs(elem_id="tabs"):
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
            with gr.Tab("Confidence", id="tab-confidence"):
                confidence_plot = gr.Plot(label="confidence vs thresholds", elem_id="confidence-plot", show_label=False)
                tier_mix_plot = gr.Plot(label="who produced each token", elem_id="tier-mix-plot", show_label=False)
            with gr.Tab("Latency", id="tab-latency"):
                latency_plot = gr.Plot(label="latency per round", elem_id="latency-plot", show_label=False)
            with gr.Tab("Speed-up", id="tab-speedup"):
                speedup_plot = gr.Plot(label="speed-up", elem_id="speedup-plot", show_label=False)
                position_plot = gr.Plot(label="acceptance by draft position", elem_id="position-plot", show_label=False)
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
            with gr.Tab("Learn", id="tab-learn"):
                gr.Markdown("Step through the last run one round at a time: what the drafter proposed, which "
                            "tier each draft went to, and why.")
                with gr.Row():
                    prev_round = gr.Button("◀ Prev", elem_id="learn-prev", scale=0)
                    learn_round = gr.Slider(1, 2, value=1, step=1, label="round", elem_id="learn-round", scale=4)
                    learn_api_round = gr.Number(1, label="round", precision=None, visible=False)
                    next_round = gr.Button("Next ▶", elem_id="learn-next", scale=0)
                learn = gr.HTML(views.learn_view({}), elem_id="learn-view", js_on_load=None,
                                label="learn view of one round (HTML)")

        # For scripts and MCP clients (`studio.api`): the numbers behind the page as labelled JSON. Not drawn.
        with gr.Column(visible=False, elem_id="api-only"):
            compare_trigger = gr.Button("compare", visible=False)
            comparison = gr.JSON(label="comparison (JSON)")  # per method: summary, text, trace; speed-ups, profile
            estimate_trigger = gr.Button("what-if estimate", visible=False)
            # text, not gr.JSON: the trace gate checks size and depth before parsing (and MCP needs a typed input)
            trace_in = gr.Textbox(label="trace (JSON text)")
            estimate = gr.JSON(label="what-if estimate (JSON)")

        # ---- events -------------------------------------------------------------------------------
        run_inputs = [prompt, model, gamma, accept, escalate, signal, temperature, max_new_tokens, seed, route, with_ar,
                      pace]
        run_outputs = [via_pane, sd_pane, ar_pane, metrics, status, traces]
        view_outputs = [confidence_plot, tier_mix_plot, latency_plot, speedup_plot, position_plot, learn_round, learn]
        whatif_inputs = [traces, accept, escalate, signal, theme]
        projection_inputs = [traces, profile, flatness, drafter_cost, slim_cost]
        # the page's own steps are private: a client sees only the endpoints named for it (`public`)
        light = dict(concurrency_limit=8, show_progress="hidden", api_visibility="private")
        on_model = dict(concurrency_id="gpu", concurrency_limit=1)  # one piece of model work at a time

        def public(name: str, **kwargs) -> dict:
            return {**kwargs, "api_name": name, "api_visibility": "public"}

        def after_run(event):
            """What follows every run and every upload, after a pause (a Run pressed right after Done goes
            first). A newer run ends the chain at `settle` (the next step follows on success only) or makes each
            later step skip; fidelity (a model pass) comes last. The steps read `settled`, the record this chain
            is for: `traces` is the newest run's by the time they are queued."""
            followup_inputs = [settled, accept, escalate, signal, theme]
            return (event.then(runs.settle, [traces], [settled], **light)
                    .success(costs.panel_after_run, [settled, theme], [cost_panel, cost_plot], **light)
                    .then(costs.profile_controls, [settled, profile], [flatness, drafter_cost, slim_cost], **light)
                    .then(costs.projection, [settled, *projection_inputs[1:]], [projection], **light)
                    .then(views.views, [settled, theme], view_outputs, **light)
                    .then(views.trace_table_after_run, [settled, trace_method],
                          [table, json_download, csv_download], **light)
                    .then(lab.what_if_view, followup_inputs, [whatif, whatif_plot], **light)
                    .then(lab.what_if_presets, followup_inputs, [presets_plot], **light)
                    .then(views.race_ready, [settled, race_view], [race_view], **light)
                    .then(runs.fidelity_after_run, [settled], [metrics, traces], api_visibility="private",
                          show_progress="hidden", **on_model))

        demo.load(None, None, theme, js=THEME_JS)
        demo.unload(forget_session)
        timer = gr.Timer(0.5, active=MODELS.loading() or MODELS.loaded(preset) is None)
        timer.tick(poll_status, [model], [device, timer], api_visibility="private", show_progress="hidden")
        model.change(load_preset, [model], [device, status], **public("load_preset", **on_model)).then(
            lab.route_search_row, [model], [route_row], api_visibility="private", show_progress="hidden")

        # A run's ticket is taken before the queue (queue=False), so Stop or a newer Run reaches it while queued.
        for trigger, endpoint in ((run.click, public("run")), (prompt.submit, {"api_visibility": "private"})):
            after_run(trigger(runs.take_run_ticket, [theme], [run_ticket, theme, race_view], js=THEME_JS,
                              queue=False, api_visibility="private").then(
                runs.run_compare, [*run_inputs, run_ticket], run_outputs, show_progress_on=[via_pane, sd_pane],
                **endpoint, **on_model))
        stop.click(runs.stop_work, None, status, **public("stop", concurrency_limit=None, queue=False))
        with_ar.change(lambda on: gr.HTML(visible=bool(on)), [with_ar], [ar_pane], api_visibility="private",
                       queue=False)
        presentation.change(None, [presentation], None, js=PRESENTATION_JS)

        card_inputs = [traces, accept, escalate, signal]
        for control in (accept, escalate, signal):
            # the card first (instant), then the slower re-drawn plots
            control.change(lab.what_if_card, card_inputs, [whatif], trigger_mode="always_last",
                           **(public("what_if", **light) if control is accept else light)).then(
                lab.what_if_figure, whatif_inputs, [whatif_plot], trigger_mode="always_last", **light).then(
                lab.what_if_presets, whatif_inputs, [presets_plot], trigger_mode="always_last", **light)
        threshold_preset.input(lab.apply_threshold_preset, [threshold_preset], [accept, escalate, signal],
                               api_visibility="private", queue=False)
        for control in (accept, escalate, signal):  # a hand on a control makes the setting custom
            control.input(None, None, threshold_preset, js=f"() => '{CUSTOM}'")
        for slider in (accept, escalate):  # a release that re-runs supersedes this session's run at once
            after_run(slider.release(runs.request_rerun, [rerun], [run_ticket, race_view], api_visibility="private",
                                     queue=False, trigger_mode="multiple").then(
                runs.rerun_on_release, [rerun, *run_inputs, run_ticket], run_outputs, api_visibility="private",
                trigger_mode="always_last", show_progress_on=[via_pane, sd_pane], **on_model))
        race.click(views.race_replay, [traces, race_speed], [race_view], **public("race", **light))

        for control in (profile, flatness, drafter_cost, slim_cost):
            control.change(costs.projection, projection_inputs, [projection], trigger_mode="always_last", **light)
        profile.input(costs.profile_controls, [traces, profile], [flatness, drafter_cost, slim_cost], **light)

        demo.load(poll_status, [model], [device, timer], api_visibility="private", show_progress="hidden").then(
            lab.route_search_row, [model], [route_row], api_visibility="private", show_progress="hidden")
        timer.tick(lab.route_search_row, [model], [route_row], api_visibility="private", show_progress="hidden")
        route_search.click(lab.take_route_ticket, None, [route_ticket], queue=False, api_visibility="private").then(
            lab.search_better_route, [model, route_ticket], [device, status, route_row],
            **public("search_route", **on_model))
        route_search_stop.click(runs.stop_work, None, status, api_visibility="private", queue=False)

        sweep.click(lab.take_sweep_ticket, [theme], [sweep_ticket, theme], js=THEME_JS, queue=False,
                    api_visibility="private").then(
            lab.measure_sweep, [prompt, model, gamma, signal, temperature, max_new_tokens, seed, route, sweep_accepts,
                                sweep_escalates, accept, escalate, theme, sweep_ticket], [frontier_plot, status],
            **public("sweep", **on_model))

        trace_method.change(views.trace_table, [traces, trace_method], [table, json_download, csv_download],
                            **public("trace_files", **light))
        after_run(upload.upload(views.replay_upload, [upload], run_outputs, **public("replay", **light)))

        learn_round.change(views.learn_view, [traces, learn_round], [learn], **light)
        # the API's own round input: the slider's range (1-2 until the page's follow-up steps widen it) would
        # refuse valid rounds; learn_view itself accepts exactly the rounds of the trace
        learn_api_round.change(views.learn_view, [traces, learn_api_round], [learn], **public("learn", **light))
        prev_round.click(lambda k, t: views.step_round(k, -1, t), [learn_round, traces], [learn_round], **light)
        next_round.click(lambda k, t: views.step_round(k, 1, t), [learn_round, traces], [learn_round], **light)

        # the same queue, concurrency group and limits as Run; the what-if needs no model
        compare_trigger.click(api.compare, run_inputs[:-1], [comparison],
                              **public("compare", show_progress="hidden", **on_model))
        estimate_trigger.click(api.what_if_estimate, [trace_in, accept, escalate, signal], [estimate],
                               **public("what_if_estimate", **light))
    return demo


def mcp_wanted() -> bool:
    """VIA_SD_MCP=1 serves the public endpoints as MCP tools too (`compare` and `what_if_estimate` among them),
    at /gradio_api/mcp/. Off by default: a page needs none of it. It needs the `mcp` package; without one a
    warning says how to install it and the page starts without MCP (not Gradio's launch error)."""
    if os.environ.get("VIA_SD_MCP", "").strip().lower() not in ("1", "true", "yes", "on"):
        return False
    try:
        import mcp  # noqa: F401
    except ImportError:
        logging.getLogger("via_sd.app").warning('VIA_SD_MCP is set but the `mcp` package is missing: '
                                                '.venv/bin/pip install "mcp>=1.21,<2" (the page starts without MCP)')
        return False
    return True


def launch(preset: str = DEFAULT_PRESET, **kwargs):
    """Start the page at once and load `preset` in the background."""
    MODELS.preload(preset)
    demo = build_demo(preset)
    demo.queue(default_concurrency_limit=1, max_size=64)
    kwargs.setdefault("max_file_size", MAX_UPLOAD_BYTES)  # the server refuses a larger upload before storing it
    kwargs.setdefault("mcp_server", mcp_wanted())
    return demo.launch(css_paths=sorted(ASSETS.glob("*.css")), theme=gr.themes.Soft(), **kwargs)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    launch(server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
           server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")))
