"""VIA-SD Studio: watch, compare and tune three-tier speculative decoding in the browser.

    python app.py                      # http://127.0.0.1:7860, embedded Qwen2.5-Coder 0.5B -> 1.5B pair
    VIA_SD_PRESET=random python app.py # tiny random pair: instant, gibberish text (mechanics only)
    VIA_SD_MCP=0 python app.py         # without the MCP server (on by default at /gradio_api/mcp/: studio.mcp_tools)

This file is the page: its layout in reading order (`studio/layout.py`, one builder per area), then the
event wiring, a few functions grouped by what they wire. Handlers are plain functions in `studio/` (the
app's runtime: models, sessions, runs, views, lab, costs, api), every piece of HTML and every figure
comes from `viz/`, and decoding is `via_sd`'s; none is re-implemented here.
"""

from __future__ import annotations

from studio.gpu import spaces  # noqa: F401  (first: on ZeroGPU `spaces` must come before torch touches CUDA)

import json
import logging
import os
import signal
import threading
from pathlib import Path
from types import SimpleNamespace

import gradio as gr

from studio import api, batch, costs, lab, layout, memory, own_pair, recorded, runs, views
from studio.downloads import forget_session
from studio.layout import DEFAULTS  # noqa: F401  (the values the controls start at, for scripts)
from studio.models import DEFAULT_PRESET, MODELS, load_preset, poll_status
from studio.views import MAX_UPLOAD_BYTES

ROOT = Path(__file__).resolve().parent
ASSETS = ROOT / "assets"
# One theme check for every event that draws figures: Gradio marks dark mode with body.dark.
THEME_JS = "() => document.body.classList.contains('dark') ? 'dark' : 'light'"
PRESENTATION_JS = "(on) => { document.body.classList.toggle('presentation', !!on); return []; }"
# the page's own steps are private: a client sees only the endpoints named for it (`public`)
LIGHT = dict(concurrency_limit=8, show_progress="hidden", api_visibility="private")
ON_MODEL = dict(concurrency_id=runs.GPU_GROUP, concurrency_limit=1)  # one piece of model work at a time


def example_prompts() -> tuple[list[list[str]], list[str]]:
    """Two prompts per task from assets/prompts/mixed.jsonl, labelled by task, and two whose answer copies from the
    input (assets/prompts/copy.jsonl: where the prompt-lookup drafter shines)."""
    examples, labels = [], []
    for name, limit in (("mixed.jsonl", None), ("copy.jsonl", 2)):
        path = ASSETS / "prompts" / name
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()] if path.exists() else []
        for line in lines[:limit]:
            item = json.loads(line)
            examples.append([item["prompt"]])
            short = item["prompt"].split("\n")[0]
            short = short.removeprefix("Solve step by step: ").removeprefix("Translate the following text ")
            task = item["task"] if name == "mixed.jsonl" else f"copy ({item['task']})"
            labels.append(f"{task}: {short[:24]}{'…' if len(short) > 24 else ''}")
    return examples, labels


def build_demo(preset: str = DEFAULT_PRESET) -> gr.Blocks:
    """The page: its layout in reading order (`studio.layout`, one builder per area), then the event wiring."""
    MODELS.served = preset
    opening = recorded.opening()  # a real run of the embedded pair, shown before any model has loaded
    memory.return_large_blocks()  # a closed session's memory goes back to the system (studio.memory)
    # Gradio copies every served file into its own cache: hourly, drop copies older than an hour
    with gr.Blocks(title="VIA-SD Studio", fill_width=True, delete_cache=(3600, 3600)) as demo:
        ui = layout.merge(layout.session_state(opening), layout.settings_sidebar(preset),
                          layout.prompt_area(preset, *example_prompts(), opening), layout.panes_and_cards(opening),
                          layout.tabs(opening), layout.api_only())

        timer = wire_session_and_models(demo, ui, preset)
        wire_runs(ui)
        wire_threshold_lab(ui)
        wire_race_and_projection(ui)
        wire_searches(demo, ui, timer)
        wire_trace_and_learn(ui)
        wire_opening(demo, ui, opening)
        wire_api(ui)
    return demo


# ---- events -----------------------------------------------------------------------------------

def public(name: str, **kwargs) -> dict:
    """An endpoint named for clients (scripts, MCP), with its other settings."""
    return {**kwargs, "api_name": name, "api_visibility": "public"}


def run_inputs(ui: SimpleNamespace) -> list:
    """The settings a run reads, in `runs.run_compare`'s order."""
    return [ui.prompt, ui.model, ui.gamma, ui.accept, ui.escalate, ui.signal, ui.temperature, ui.max_new_tokens,
            ui.seed, ui.route, ui.with_ar, ui.pace]


def run_outputs(ui: SimpleNamespace) -> list:
    """What a run (or a replayed upload) draws as it streams: the three panes, the cards, the status, the traces."""
    return [ui.via_pane, ui.sd_pane, ui.ar_pane, ui.metrics, ui.status, ui.traces]


def projection_inputs(ui: SimpleNamespace) -> list:
    """The run, the cost profile and the three sliders that re-shape it."""
    return [ui.traces, ui.profile, ui.flatness, ui.drafter_cost, ui.slim_cost]


def after_run(event, ui: SimpleNamespace):
    """What follows every run and every upload, after a pause (a Run pressed right after Done goes
    first). A newer run ends the chain at `settle` (the next step follows on success only) or makes each
    later step skip; fidelity (a model pass) comes last. The steps read `settled`, the record this chain
    is for: `traces` is the newest run's by the time they are queued."""
    followup_inputs = [ui.settled, ui.accept, ui.escalate, ui.signal, ui.theme]
    view_outputs = [ui.confidence_plot, ui.tier_mix_plot, ui.latency_plot, ui.speedup_plot, ui.position_plot,
                    ui.learn_round, ui.learn]
    return (event.then(runs.settle, [ui.traces], [ui.settled], **LIGHT)
            .success(costs.panel_after_run, [ui.settled, ui.theme], [ui.cost_panel, ui.cost_plot], **LIGHT)
            .then(costs.profile_controls, [ui.settled, ui.profile], [ui.flatness, ui.drafter_cost, ui.slim_cost],
                  **LIGHT)
            .then(costs.projection, [ui.settled, *projection_inputs(ui)[1:]], [ui.projection], **LIGHT)
            .then(views.views, [ui.settled, ui.theme], view_outputs, **LIGHT)
            .then(views.trace_table_after_run, [ui.settled, ui.trace_method],
                  [ui.table, ui.json_download, ui.csv_download], **LIGHT)
            .then(lab.what_if_view, followup_inputs, [ui.whatif, ui.whatif_plot], **LIGHT)
            .then(lab.what_if_presets, followup_inputs, [ui.presets_plot], **LIGHT)
            .then(views.race_ready, [ui.settled, ui.race_view], [ui.race_view], **LIGHT)
            .then(runs.fidelity_after_run, [ui.settled], [ui.metrics, ui.traces], api_visibility="private",
                  show_progress="hidden", **ON_MODEL))


def wire_session_and_models(demo: gr.Blocks, ui: SimpleNamespace, preset: str) -> gr.Timer:
    """The theme, a closed page's files, the models' status while they load, and a new model preset."""
    demo.load(None, None, ui.theme, js=THEME_JS)
    demo.unload(forget_session)
    timer = gr.Timer(0.5, active=MODELS.loading() or MODELS.loaded(preset) is None)
    timer.tick(poll_status, [ui.model], [ui.device, timer], api_visibility="private", show_progress="hidden")
    ui.model.change(load_preset, [ui.model], [ui.device, ui.status], **public("load_preset", preprocess=False, **ON_MODEL)).then(
        lab.route_search_row, [ui.model], [ui.route_row], api_visibility="private", show_progress="hidden")
    return timer


def wire_runs(ui: SimpleNamespace) -> None:
    """Run (the button or Enter in the prompt), Stop, and the settings that change how the page shows."""
    # A run's ticket is taken before the queue (queue=False), so Stop or a newer Run reaches it while queued.
    for trigger, endpoint in ((ui.run.click, public("run")), (ui.prompt.submit, {"api_visibility": "private"})):
        after_run(trigger(runs.take_run_ticket, [ui.theme], [ui.run_ticket, ui.theme, ui.race_view, ui.status],
                          js=THEME_JS, queue=False, api_visibility="private").then(
            runs.run_compare, [*run_inputs(ui), ui.run_ticket, ui.drafter], run_outputs(ui),
            show_progress=runs.PROGRESS, preprocess=False, **endpoint, **ON_MODEL), ui)
    ui.stop.click(runs.stop_work, None, ui.status, **public("stop", concurrency_limit=None, queue=False))
    ui.with_ar.change(lambda on: gr.HTML(visible=bool(on)), [ui.with_ar], [ui.ar_pane], api_visibility="private",
                      queue=False)
    ui.presentation.change(None, [ui.presentation], None, js=PRESENTATION_JS)


def wire_threshold_lab(ui: SimpleNamespace) -> None:
    """The thresholds: the what-if estimate as they move, their presets, and a re-run when a slider is released."""
    card_inputs = [ui.traces, ui.accept, ui.escalate, ui.signal]
    whatif_inputs = [*card_inputs, ui.theme]
    for control in (ui.accept, ui.escalate, ui.signal):
        # the card first (instant), then the slower re-drawn plots
        control.change(lab.what_if_card, card_inputs, [ui.whatif], trigger_mode="always_last",
                       **(public("what_if", preprocess=False, **LIGHT) if control is ui.accept else LIGHT)).then(
            lab.what_if_figure, whatif_inputs, [ui.whatif_plot], trigger_mode="always_last", **LIGHT).then(
            lab.what_if_presets, whatif_inputs, [ui.presets_plot], trigger_mode="always_last", **LIGHT)
    ui.threshold_preset.input(lab.apply_threshold_preset, [ui.threshold_preset], [ui.accept, ui.escalate, ui.signal],
                              api_visibility="private", queue=False)
    for control in (ui.accept, ui.escalate, ui.signal):  # a hand on a control makes the setting custom
        control.input(None, None, ui.threshold_preset, js=f"() => '{lab.CUSTOM}'")
    for slider in (ui.accept, ui.escalate):  # a release that re-runs supersedes this session's run at once
        after_run(slider.release(runs.request_rerun, [ui.rerun], [ui.run_ticket, ui.race_view],
                                 api_visibility="private", queue=False, trigger_mode="multiple").then(
            runs.rerun_on_release, [ui.rerun, *run_inputs(ui), ui.run_ticket, ui.drafter], run_outputs(ui),
            api_visibility="private", trigger_mode="always_last", show_progress=runs.PROGRESS, **ON_MODEL), ui)


def wire_race_and_projection(ui: SimpleNamespace) -> None:
    """The race replay, and "where it would pay" redrawn as its profile and sliders move."""
    ui.race.click(views.race_replay, [ui.traces, ui.race_speed], [ui.race_view],
                  **public("race", preprocess=False, **LIGHT))
    for control in (ui.profile, ui.flatness, ui.drafter_cost, ui.slim_cost):
        control.change(costs.projection, projection_inputs(ui), [ui.projection], trigger_mode="always_last",
                       **LIGHT)
    ui.profile.input(costs.profile_controls, [ui.traces, ui.profile], [ui.flatness, ui.drafter_cost, ui.slim_cost],
                     **LIGHT)


def wire_searches(demo: gr.Blocks, ui: SimpleNamespace, timer: gr.Timer) -> None:
    """The search for a better slim route (offered once a model is loaded) and the measured sweep."""
    demo.load(poll_status, [ui.model], [ui.device, timer], api_visibility="private", show_progress="hidden").then(
        lab.route_search_row, [ui.model], [ui.route_row], api_visibility="private", show_progress="hidden")
    timer.tick(lab.route_search_row, [ui.model], [ui.route_row], api_visibility="private", show_progress="hidden")
    ui.route_search.click(lab.take_route_ticket, None, [ui.route_ticket], queue=False,
                          api_visibility="private").then(
        lab.search_better_route, [ui.model, ui.route_ticket], [ui.device, ui.status, ui.route_row],
        **public("search_route", **ON_MODEL))
    ui.route_search_stop.click(runs.stop_work, None, ui.status, api_visibility="private", queue=False)
    own_pair.wire(ui, ON_MODEL)

    ui.sweep.click(lab.take_sweep_ticket, [ui.theme], [ui.sweep_ticket, ui.theme], js=THEME_JS, queue=False,
                   api_visibility="private").then(
        lab.measure_sweep, [ui.prompt, ui.model, ui.gamma, ui.signal, ui.temperature, ui.max_new_tokens, ui.seed,
                            ui.route, ui.sweep_accepts, ui.sweep_escalates, ui.accept, ui.escalate, ui.theme,
                            ui.sweep_ticket], [ui.frontier_plot, ui.status],
        **public("sweep_plot", preprocess=False, **ON_MODEL))


def wire_trace_and_learn(ui: SimpleNamespace) -> None:
    """The trace table and its files, a replayed upload, and the learn view's rounds."""
    ui.trace_method.change(views.trace_table, [ui.traces, ui.trace_method],
                           [ui.table, ui.json_download, ui.csv_download], **public("trace_files", **LIGHT))
    after_run(ui.upload.upload(views.replay_upload, [ui.upload], run_outputs(ui), **public("replay", **LIGHT)), ui)

    ui.learn_round.change(views.learn_view, [ui.traces, ui.learn_round], [ui.learn], **LIGHT)
    # the API's own round input: the slider's range (1-2 until the page's follow-up steps widen it) would
    # refuse valid rounds; learn_api accepts exactly the rounds of the trace and refuses the rest by name
    ui.learn_api_round.change(views.learn_api, [ui.traces, ui.learn_api_round], [ui.learn],
                              **public("learn", preprocess=False, **LIGHT))
    ui.prev_round.click(lambda k, t: views.step_round(k, -1, t), [ui.learn_round, ui.traces], [ui.learn_round],
                        **LIGHT)
    ui.next_round.click(lambda k, t: views.step_round(k, 1, t), [ui.learn_round, ui.traces], [ui.learn_round],
                        **LIGHT)


def wire_opening(demo: gr.Blocks, ui: SimpleNamespace, opening: dict | None) -> None:
    """The recorded run the page opens on (`studio.recorded`): its panes, cards, race and learn view are in the
    page itself; its figures, trace table and what-if follow as after any run, none of them needing a model."""
    if opening:
        after_run(demo.load(views.race_ready, [ui.traces, ui.race_view], [ui.race_view], **LIGHT), ui)


def wire_api(ui: SimpleNamespace) -> None:
    """The JSON endpoints for scripts and MCP: the same queue, concurrency group and limits as Run; the
    what-if needs no model. Their inputs reach the handlers as sent (preprocess=False, as /run's, /sweep's,
    /what_if's and /learn's): the handlers check every one against the one table of bounds (`studio.inputs`,
    `via_sd.core.bounds.BOUNDS`) and refuse it by name, where Gradio's own checks would coerce ("yes" -> true,
    1.5 -> 2) or refuse without naming it."""
    ui.compare_trigger.click(api.compare, [*run_inputs(ui)[:-1], ui.drafter, *ui.knobs], [ui.comparison],  # no pace
                             **public("compare", show_progress="hidden", preprocess=False, **ON_MODEL))
    decoding = [ui.temperature, ui.max_new_tokens, ui.seed, ui.route, ui.drafter, *ui.knobs]
    ui.bench_trigger.click(batch.bench, [ui.prompts, ui.methods, ui.repeats, ui.warmup, ui.fidelity, ui.limit,
                                         ui.model, ui.gamma, ui.accept, ui.escalate, ui.signal, *decoding],
                           [ui.bench_result], **public("bench", preprocess=False, **ON_MODEL))
    ui.sweep_trigger.click(batch.sweep, [ui.prompts, ui.accepts, ui.escalates, ui.repeats, ui.warmup, ui.limit,
                                         ui.model, ui.gamma, ui.signal, *decoding],
                           [ui.sweep_result], **public("sweep", preprocess=False, **ON_MODEL))
    ui.estimate_trigger.click(api.what_if_estimate, [ui.trace_in, ui.accept, ui.escalate, ui.signal],
                              [ui.estimate], **public("what_if_estimate", preprocess=False, **LIGHT))


def mcp_wanted() -> bool:
    """The MCP server (`studio.mcp_tools`: compare, bench, sweep, what_if_estimate, runs, stop) at /gradio_api/mcp/,
    on unless VIA_SD_MCP=0. It needs the `mcp` package (requirements.txt); without one a warning says how to
    install it and the page starts without MCP."""
    if os.environ.get("VIA_SD_MCP", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    try:
        import mcp  # noqa: F401
    except ImportError:
        logging.getLogger("via_sd.app").warning('the `mcp` package is missing: .venv/bin/pip install "mcp>=1.21,<2" '
                                                '(the page starts without MCP; VIA_SD_MCP=0 says so quietly)')
        return False
    return True


def mcp_options(wanted: bool | None = None) -> dict:
    """launch()'s options for MCP: our server (`studio.mcp_tools.lifespan` mounts it) when wanted, never Gradio's
    own (stateless: every MCP call of every client would share one Gradio session)."""
    from studio import mcp_tools

    wanted = mcp_wanted() if wanted is None else wanted
    return {"mcp_server": False, **({"app_kwargs": {"lifespan": mcp_tools.lifespan}} if wanted else {})}


def stop_cleanly_on_sigterm() -> None:
    """SIGTERM (a container stopping, `kill`) ends the page as Ctrl-C does: the server closes, Gradio empties its
    cache and the exit handlers remove the download folder; by default SIGTERM ends the process with none of it."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupt)


def launch(preset: str = DEFAULT_PRESET, **kwargs):
    """Serve the page (no torch imported yet: studio.engine), then load `preset`; a Run meanwhile waits for it."""
    MODELS.announce(preset)  # the page shows the load from its first second
    demo = build_demo(preset).queue(default_concurrency_limit=1, max_size=64)
    block = not kwargs.pop("prevent_thread_lock", False)
    stop_cleanly_on_sigterm()
    served = demo.launch(**{**mcp_options(), "max_file_size": MAX_UPLOAD_BYTES, **kwargs}, prevent_thread_lock=True,
                         css_paths=sorted(ASSETS.glob("*.css")), theme=gr.themes.Soft())  # a larger upload: refused
    MODELS.preload(preset)
    if block:
        demo.block_thread()  # until Ctrl-C or SIGTERM (stop_cleanly_on_sigterm)
    return served


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    launch(server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
           server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")))
