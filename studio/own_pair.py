"""The model panel's own pair: a drafter and a verifier a person brings, and a slim route searched for it.

A pair is named by hub ids (where the hub is reachable), local model folders or .gguf files. Its two tokenizers
are compared first (vocabulary, special tokens, sample text: `via_sd.core.shared_vocab`): a mismatch is refused
naming what differs, with nothing freed or loaded, so the pair loaded before keeps working. A pair that shares
one is loaded as the preset `own` (`studio.models.OWN`) with the load's progress. Until a route exists for its
verifier it runs none, and the model line and this panel say so (`via_sd.NO_ROUTE`). The panel's route search
(`via_sd.route_search.route_for`) shows its progress, ends on Stop (nothing kept) or when its budget in minutes
runs out (the route found so far, kept), caches its route, and offers it as the JSON file the CLI reads
(`--route FILE`). Here are the panel's components (`panel`, placed by `studio.layout`), its handlers and their
wiring (`wire`, called by app.py).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from types import SimpleNamespace

import gradio as gr

import viz.page as page
from via_sd import NO_ROUTE
from via_sd.core.shared_vocab import load_tokenizer, tokenizer_difference

from .downloads import DOWNLOADS, write_atomic
from .engine import how_made, route_for
from .gpu import gpu
from .inputs import MAX_NAME_CHARS, UserError, refuse, shown
from .loading import without_paths
from .models import LOCK_REASON, MODELS, OWN, preset_choices, preset_locked
from .runs import stop_work
from .sessions import SESSIONS

log = logging.getLogger("via_sd.app")
HOLD_SEARCH = "VIA_SD_TEST_HOLD_SEARCH_S"  # for tests: each progress event of a search waits this long (Stop lands)
MAX_BUDGET_MIN = 240.0
PANEL_HINT = ("A drafter and a verifier of one family: hub ids (where the hub is reachable), local model folders "
              "or .gguf files. Their tokenizers are compared before anything loads.")


def short(source: str) -> str:
    """A source as the model line shows it: a hub id whole, a folder or file by its last two parts."""
    parts = Path(source).parts
    return source if len(parts) <= 2 else str(Path(*parts[-2:]))


def source(field: str, value) -> str:
    if not isinstance(value, str) or not value.strip() or len(value.strip()) > MAX_NAME_CHARS:
        raise UserError(f"{field} must be a hub id, a model folder or a .gguf file ({MAX_NAME_CHARS} characters at "
                        f"most), got {shown(value)}")
    return os.path.expanduser(value.strip())


def budget_minutes(value) -> float:
    try:
        minutes = float(value)
    except (TypeError, ValueError):
        minutes = float("nan")
    if not 0 < minutes <= MAX_BUDGET_MIN:
        raise UserError(f"route search budget must be a number of minutes above 0 and at most {MAX_BUDGET_MIN:g}, "
                        f"got {shown(value)}")
    return minutes


def panel_status(message: str = "", kind: str = "info") -> str:
    """The panel's line: `message`, else where the own pair stands (its route, or that it has none yet)."""
    if message:
        return page.status_html(message, kind)
    route = MODELS.default_route(OWN) if MODELS.loaded(OWN) is not None else None
    if route is None:
        return page.status_html(PANEL_HINT)
    if route.meta.get("missing"):
        return f'<div data-route="missing">{page.status_html(f"{NO_ROUTE}. Search one below.")}</div>'
    return f'<div data-route="found">{page.status_html(how_made(route), "ok")}</div>'


def refusal(drafter: str, verifier: str) -> str | None:
    """Why the two cannot be a pair, from their tokenizers alone (None: they share one)."""
    try:
        tokenizers = [load_tokenizer(drafter), load_tokenizer(verifier)]
    except Exception as err:
        return f"could not read a tokenizer: {type(err).__name__}: {without_paths(str(err))[:300]}"
    difference = tokenizer_difference(*tokenizers)
    return f"drafter and verifier do not share a tokenizer: {difference}" if difference else None


@gpu(duration=300)
def load_own_pair(drafter, verifier, progress=gr.Progress()):
    """Check that drafter and verifier share a tokenizer, then load them as the `own` preset with progress.
    Returns (model preset control, device line, status, panel line)."""
    if preset_locked():
        raise refuse(f"Your own pair cannot load here: the model is {LOCK_REASON}.")
    try:
        drafter, verifier = source("drafter", drafter), source("verifier", verifier)
    except UserError as err:
        raise refuse(err) from None
    progress(0.0, desc="comparing the two tokenizers")
    why = refusal(drafter, verifier)
    if why:
        kept = "the pair loaded before keeps running" if MODELS.loaded(MODELS.served) or MODELS.loaded(OWN) else \
            "nothing else changed"
        return (gr.skip(), gr.skip(), page.status_html(f"Refused: {why}", "error"),
                panel_status(f"Refused, nothing loaded ({kept}): {why}", "error"))
    MODELS.choose_own({"drafter": drafter, "verifier": verifier, "route": None,
                       "about": f"{short(drafter)} → {short(verifier)}"})
    try:
        MODELS.pair(OWN, progress)
    except UserError as err:
        return gr.skip(), MODELS.status(OWN), page.status_html(str(err), "error"), panel_status(str(err), "error")
    return (gr.Dropdown(choices=preset_choices(), value=OWN), MODELS.status(OWN),
            page.status_html("your own pair is loaded", "ok"), panel_status())


def take_search_ticket(request: gr.Request = None):
    return SESSIONS.get(request).ticket("route")


@gpu(duration=300)
def search_own_route(budget, ticket=None, request: gr.Request = None, progress=gr.Progress()):
    """Search a slim route for the own pair (progress shown, Stop abandons it, the budget keeps the route found so
    far), cache it and offer its JSON. Returns (device line, panel line, route file)."""
    try:
        seconds = 60 * budget_minutes(budget)
    except UserError as err:
        raise refuse(err) from None
    shared = MODELS.loaded(OWN)
    if shared is None:
        return gr.skip(), panel_status("Load your own pair first.", "error"), gr.skip()
    job = SESSIONS.get(request).job("route", ticket)
    hold = float(os.environ.get(HOLD_SEARCH, "") or 0)

    def hear(message: str, fraction: float) -> None:
        progress(fraction, desc=message)
        time.sleep(hold)

    try:
        route = route_for(MODELS.view(shared, OWN, "default"), progress=hear, stop=job, budget_s=seconds)
    except Exception as err:
        log.exception("route search failed")
        return gr.skip(), panel_status(f"Route search failed: {type(err).__name__}: {err}", "error"), gr.skip()
    search = route.meta.get("search", {})
    if search.get("stopped") and (job.is_set() or not route.skip):
        why = "stopped" if job.is_set() else "out of budget before it found a route"
        return MODELS.status(OWN), panel_status(f"Route search {why}: {NO_ROUTE}.", "stop"), gr.skip()
    MODELS.set_default_route(OWN, route)
    path = DOWNLOADS.folder(request) / f"{route.name}.json"
    write_atomic(path, route.to_json() + "\n")
    budget_note = " (the budget ran out: fewer sub-layers than asked)" if search.get("stopped") else ""
    return (MODELS.status(OWN), panel_status(f"Route cached for this verifier{budget_note}: {how_made(route)}", "ok"),
            gr.DownloadButton(value=str(path), visible=True))


def panel(visible: bool = True) -> SimpleNamespace:
    """The panel (in the settings, under the preset; `studio.layout`): drafter and verifier, Load, where the pair and
    its route stand, and a route search with a budget, Stop and the route file."""
    with gr.Accordion("Your own pair", open=False, elem_id="own-pair", visible=visible):
        own_drafter = gr.Textbox(label="drafter", placeholder="hub id, model folder or .gguf file",
                                 elem_id="own-drafter", max_lines=1)
        own_verifier = gr.Textbox(label="verifier", placeholder="hub id, model folder or .gguf file",
                                  elem_id="own-verifier", max_lines=1)
        own_load = gr.Button("Check tokenizers and load", elem_id="own-load", size="sm", variant="primary")
        own_status = gr.HTML(panel_status(), elem_id="own-status", label="own pair status (HTML)")
        with gr.Row(equal_height=True):
            own_budget = gr.Number(10, minimum=0.1, maximum=MAX_BUDGET_MIN, label="route search budget (min)",
                                   elem_id="own-budget", min_width=120)
            own_search = gr.Button("Search a route", elem_id="own-search", size="sm", min_width=100)
            own_stop = gr.Button("Stop", elem_id="own-stop", size="sm", variant="stop", min_width=60)
        own_route_file = gr.DownloadButton("Download the route JSON", elem_id="own-route-file", size="sm",
                                           visible=False)
    return SimpleNamespace(own_drafter=own_drafter, own_verifier=own_verifier, own_load=own_load,
                           own_status=own_status, own_budget=own_budget, own_search=own_search, own_stop=own_stop,
                           own_route_file=own_route_file)


def wire(ui: SimpleNamespace, on_model: dict) -> None:
    """The panel's events (called by app.py's wiring; `on_model`: its concurrency group of model work): load the
    pair (tokenizers compared first), search its route, Stop."""
    ui.own_load.click(load_own_pair, [ui.own_drafter, ui.own_verifier],
                      [ui.model, ui.device, ui.status, ui.own_status], api_visibility="private", **on_model)
    ui.own_search.click(take_search_ticket, None, [ui.route_ticket], queue=False,
                        api_visibility="private").then(
        search_own_route, [ui.own_budget, ui.route_ticket], [ui.device, ui.own_status, ui.own_route_file],
        api_visibility="private", show_progress_on=[ui.own_status], **on_model)
    ui.own_stop.click(stop_work, None, ui.status, api_visibility="private", queue=False)

