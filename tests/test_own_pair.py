"""A route for a pair that has none, as the app's model panel searches it: Stop abandons the search (nothing
cached), a budget that runs out keeps the route found so far (cached under a name of its own, readable as the
CLI's --route file, never taken for a finished search); and the panel's field checks."""

import threading
import time

import pytest

from via_sd import tiny_random_pair
from via_sd.core.routing import resolve_route
from via_sd.route_search import default_texts, how_made, route_cache_dir, saved_route
from via_sd.route_search.resolve import route_for


@pytest.fixture
def pair(tmp_path, monkeypatch):
    monkeypatch.setenv("VIA_SD_CACHE", str(tmp_path / "cache"))
    pair = tiny_random_pair()
    pair.verifier_name = "own-verifier"
    return pair


def test_stop_abandons_the_search_and_caches_nothing(pair):
    stop = threading.Event()
    stop.set()
    route = route_for(pair, stop=stop)
    assert route.meta["search"]["stopped"] and route.skip == ()
    assert not list(route_cache_dir().glob("*.json"))


def test_a_budget_that_runs_out_keeps_the_route_so_far(pair):
    default_texts(pair)  # the calibration texts, cached: the budget is spent in the search itself
    budget_s = 0.5

    def slow_after_the_first_step(message, fraction):
        if "step 1/" in message:
            time.sleep(budget_s + 0.1)  # the swaps that follow find the budget spent

    route = route_for(pair, progress=slow_after_the_first_step, budget_s=budget_s)
    assert route.name == "own-verifier-s10-budget" and len(route.skip) == 1
    assert route.meta["search"]["stopped"] and route.meta["search"]["budget_s"] == budget_s
    assert "held_out" in route.meta  # measured like a finished search
    cached = route_cache_dir() / "own-verifier-s10-budget.json"
    assert resolve_route(str(cached), 4).skip == route.skip  # the file the CLI's --route reads
    assert saved_route(pair) is None  # never mistaken for the finished search of this ratio
    assert "searched" in how_made(route)


def test_the_panel_names_a_bad_field():
    from studio.inputs import UserError
    from studio.own_pair import budget_minutes, source

    assert source("drafter", " ~/models/x ").endswith("/models/x")
    for bad in ("", "   ", None, 3, "x" * 300):
        with pytest.raises(UserError, match="drafter must be a hub id"):
            source("drafter", bad)
    assert budget_minutes("2.5") == 2.5
    for bad in (0, -1, "soon", None, 10_000):
        with pytest.raises(UserError, match="route search budget must be"):
            budget_minutes(bad)


def test_the_via_lane_of_a_run_without_a_route_says_so(tmp_path):
    import viz.page
    from via_sd import NO_ROUTE, DecodeConfig, generate

    assert viz.page.NO_ROUTE == NO_ROUTE
    unrouted, routed = tiny_random_pair(), tiny_random_pair(route=["mlp.2"])
    config = DecodeConfig(max_new_tokens=4, chat=False, gamma=2)
    assert NO_ROUTE in viz.page.pane_html(generate(unrouted, "hi", "via", config), "via")
    assert NO_ROUTE not in viz.page.pane_html(generate(routed, "hi", "via", config), "via")
    assert NO_ROUTE not in viz.page.pane_html(generate(unrouted, "hi", "sd", config), "sd")
