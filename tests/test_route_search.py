"""Route search for the slim verifier: ratios, the first/last-layer rule, JSON, errors, honest numbers."""

import json
import random
import threading

import pytest
import torch
from transformers import DynamicCache

from via_sd import PRESETS, load_pair, tiny_random_pair
from via_sd.__main__ import main
from via_sd.core.provisional import provisional_route
from via_sd.route_search import (MAX_RATIO, Calibration, TeacherForced, generate_calibration, how_made, measure_route,
                                 model_identity, pick_route, route_for, search_route, skippable, sublayer_index,
                                 sublayer_name)
from via_sd.core.routing import ROUTES_DIR, Route, resolve_route

PROMPTS = ["hello world", "The quick brown fox", "x = 1\ny = 2\n", "def f(a):"]
HELD_OUT = ["Once upon a time", "SELECT * FROM t"]


@pytest.fixture(scope="module")
def pair():
    """An 8-layer tiny verifier: 12 skippable sub-layers, later layers refine rather than overwrite."""
    return tiny_random_pair(seed=0, verifier_layers=8)


@pytest.fixture(scope="module")
def texts(pair):
    """The full verifier's own continuations: calibration and held-out prompts differ."""
    return (generate_calibration(pair, PROMPTS, 16, "tiny calibration"),
            generate_calibration(pair, HELD_OUT, 16, "tiny held-out"))


@pytest.fixture(scope="module")
def calibration(pair, texts):
    return TeacherForced(pair.verifier, texts[0])


@pytest.fixture(scope="module")
def searched(pair, calibration):
    return search_route(pair, 0.25, calibration, name="tiny-s25")


def test_search_finds_a_route_of_the_requested_ratio_that_never_skips_the_first_or_last_layer(
        pair, calibration, searched):
    for route, ratio, count in [(searched, 0.25, 4), (search_route(pair, 0.375, calibration, objective="kl-per-cost",
                                                                   swaps=2), 0.375, 6)]:
        assert len(route.skip) == count and route.skip_fraction == ratio
        layers = {int(s.split(".")[1]) for s in route.skip}
        assert layers and 0 not in layers and 7 not in layers
        assert resolve_route(route, 8).skip == route.skip  # valid for the slim verifier
    assert search_route(pair, 0.0, calibration).skip == ()


def test_search_beats_random_routes_of_the_same_ratio(pair, searched, texts):
    route = searched
    held_out = TeacherForced(pair.verifier, texts[1])
    searched = held_out.evaluate({sublayer_index(s) for s in route.skip})
    rng = random.Random(0)
    randoms = [held_out.evaluate(rng.sample(skippable(8), 4)) for _ in range(8)]
    assert searched.kl < min(r.kl for r in randoms)
    assert searched.agreement >= max(r.agreement for r in randoms)


def test_a_resumed_pass_equals_a_fresh_pass_and_the_slim_verifier(pair, calibration, texts):
    base = calibration.evaluate({5}, record=True)
    resumed = calibration.evaluate({5, 9}, start=9, base=base, record=True)
    fresh = calibration.evaluate({5, 9})
    assert resumed.kl == pytest.approx(fresh.kl, abs=1e-6) and resumed.agreement == fresh.agreement
    # the teacher-forced pass is the slim verifier's own forward, position by position
    seq, start = texts[0].sequences[0], texts[0].starts[0]
    pair.set_route([sublayer_name(5), sublayer_name(9)])
    logits = pair.slim(torch.tensor([seq]), past_key_values=DynamicCache()).logits[0, start - 1:len(seq) - 1]
    ours = calibration.log_probs({5, 9})[:len(seq) - start]
    finite = torch.isfinite(ours)
    torch.testing.assert_close(torch.log_softmax(logits.float(), -1)[finite], ours[finite], rtol=1e-4, atol=1e-4)
    pair.set_route("none")


def test_a_searched_and_measured_route_round_trips_through_json(pair, searched, texts, tmp_path):
    route = measure_route(pair, searched, {"held_out": texts[1]}, repeats=2)
    path = tmp_path / "tiny-s25.json"
    path.write_text(route.to_json())
    again = resolve_route(str(path), 8)
    assert again == route and again.to_dict() == route.to_dict() and again.name == "tiny-s25"
    assert Route.from_dict(json.loads(route.to_json())).meta == route.meta
    cost = again.meta["cost"]
    assert cost["device"].startswith("cpu") and cost["verify_step"]["tokens"] == 6
    assert cost["one_token"]["ratio"] > 0 and cost["verify_step"]["full_ms"] > 0
    assert 0 < again.meta["weights"]["read"] < 1 and again.meta["model"] == model_identity(pair)


def test_unknown_sublayers_and_ratios_outside_the_range_are_clear_errors(pair, calibration):
    for ratio in (-0.1, 0.95, 1.0, "0.3"):
        with pytest.raises(ValueError, match=rf"\[0, {MAX_RATIO}\]"):
            search_route(pair, ratio, calibration)
    with pytest.raises(ValueError, match="at most 12"):
        search_route(pair, 0.8, calibration)  # 13 of 16 sub-layers, but layers 0 and 7 are kept
    with pytest.raises(ValueError, match="unknown sub-layer"):
        search_route(pair, 0.25, calibration, start=["ffn.3"])
    with pytest.raises(ValueError, match="first or last"):
        search_route(pair, 0.25, calibration, start=["mlp.7"])
    with pytest.raises(ValueError, match="already skips"):
        search_route(pair, 0.125, calibration, start=["mlp.3", "mlp.4", "mlp.5"])


def test_the_cli_rejects_a_bad_ratio_before_loading_models(capsys):
    assert main(["route", "--preset", "random", "--skip-ratio", "1.5"]) == 2
    assert "[0, 0.9]" in capsys.readouterr().err


def test_search_can_be_stopped_and_keeps_the_route_so_far(pair, calibration):
    stop = threading.Event()
    seen = []

    def progress(message, fraction):
        seen.append(message)
        if "step 2/" in message:
            stop.set()

    route = search_route(pair, 0.375, calibration, progress=progress, stop=stop)
    assert route.meta["search"]["stopped"] and len(route.skip) == 2
    assert any("stopped" in m for m in seen)


def test_the_agreement_a_route_file_claims_is_reproduced_by_recomputing_it(pair, texts, tmp_path, monkeypatch):
    monkeypatch.setenv("VIA_SD_CACHE", str(tmp_path / "cache"))
    tiny = tiny_random_pair()  # the "random" preset's pair
    for name, prompts in (("cal.json", PROMPTS), ("held.json", HELD_OUT)):
        (tmp_path / name).write_text(json.dumps(generate_calibration(tiny, prompts, 12, name).to_dict()))
    out = tmp_path / "r.json"
    assert main(["route", "--preset", "random", "--skip-ratio", "0.25", "--out", str(out), "--repeats", "1",
                 "--calibration", str(tmp_path / "cal.json"), "--held-out", str(tmp_path / "held.json")]) == 0
    claimed = json.loads(out.read_text())
    assert len(claimed["skip"]) == 2 and claimed["skip_ratio"] == 0.25 and "cost" in claimed
    route = resolve_route(str(out), 4)
    for key, file in (("calibration", "cal.json"), ("held_out", "held.json")):
        texts_ = Calibration.from_dict(json.loads((tmp_path / file).read_text()))
        again = TeacherForced(tiny.verifier, texts_).evaluate({sublayer_index(s) for s in route.skip})
        assert claimed[key]["top1_agreement"] == round(again.agreement, 4)
        assert claimed[key]["kl"] == pytest.approx(again.kl, abs=1e-5)
        assert claimed[key]["scored_tokens"] == texts_.scored_tokens


def test_a_pair_without_a_route_gets_one_searched_once_and_cached(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VIA_SD_CACHE", str(tmp_path))
    tiny = tiny_random_pair()
    calibration_dir = tmp_path / "routes" / "calibration"
    calibration_dir.mkdir(parents=True)
    (calibration_dir / "tiny.json").write_text(json.dumps({
        "model": model_identity(tiny), "calibration": generate_calibration(tiny, PROMPTS, 12).to_dict(),
        "held_out": generate_calibration(tiny, HELD_OUT, 12).to_dict()}))
    messages = []
    first = route_for(tiny, progress=lambda m, f: messages.append(m), skip_ratio=0.25)
    assert len(first.skip) == 2 and any("searching" in m for m in messages)
    assert (tmp_path / "routes" / f"{first.name}.json").is_file()
    messages.clear()
    again = route_for(tiny, progress=lambda m, f: messages.append(m), skip_ratio=0.25)
    assert again.skip == first.skip and not messages  # found in the cache, no search
    assert main(["route", "--report", "--preset", "random"]) == 0
    assert first.name in capsys.readouterr().out


def test_shipped_routes_are_valid_and_carry_their_measurements():
    for path in sorted(ROUTES_DIR.glob("*.json")):
        data = json.loads(path.read_text())
        route = resolve_route(path.stem, data["num_layers"])
        assert route.skip and route.num_layers == data["num_layers"]
        if "provisional" in data.get("method", ""):
            continue
        for key in ("calibration", "held_out"):
            assert 0 <= data[key]["top1_agreement"] <= 1 and data[key]["kl"] >= 0
        assert data["cost"]["device"] and data["cost"]["one_token"]["ratio"] > 0
        assert data["cost"]["verify_step"]["tokens"] == data["cost"]["gamma"] + 1
        assert data["model"]["num_layers"] == data["num_layers"] and data["method"]


def test_the_provisional_rule_skips_attention_of_evenly_spaced_middle_layers_and_says_so():
    route = provisional_route(28)
    layers = [int(s.split(".")[1]) for s in route.skip]
    assert all(s.startswith("attn.") for s in route.skip) and len(layers) == 6
    assert 0 not in layers and 27 not in layers and max(b - a for a, b in zip(layers, layers[1:])) <= 5
    assert route.meta["provisional"] and route.meta["method"].startswith("provisional")
    assert resolve_route(route, 28).skip == route.skip  # a valid route for the slim verifier
    assert provisional_route(4).skip == ("attn.2",) and provisional_route(2).skip == ()


@pytest.fixture
def hub_preset(tmp_path, monkeypatch):
    """A preset like "gpu" or "tiny" (no shipped route), its models in local folders; an empty route cache."""
    monkeypatch.setenv("VIA_SD_CACHE", str(tmp_path / "cache"))
    tiny = tiny_random_pair()
    for name, model in (("drafter", tiny.drafter), ("verifier", tiny.verifier)):
        model.save_pretrained(tmp_path / name)
        tiny.tokenizer.save_pretrained(tmp_path / name)
    monkeypatch.setitem(PRESETS, "hub-test", {"drafter": str(tmp_path / "drafter"), "route": None, "about": "test",
                                              "verifier": str(tmp_path / "verifier")})
    return "hub-test"


def test_a_preset_without_a_route_starts_at_once_on_the_provisional_route_then_a_cached_one(hub_preset, tmp_path):
    pair = load_pair(hub_preset, device="cpu")
    assert pair.route.meta["provisional"] and pair.route.skip == provisional_route(4).skip
    messages = []
    assert pick_route(pair, progress=lambda m, f: messages.append(m)) is pair.route and pair.route.meta["provisional"]
    assert len(messages) == 1 and "using the provisional rule" in messages[0]  # told so, nothing searched
    assert "provisional" in how_made(pair.route)
    cached = tmp_path / "cache" / "routes" / "hub-s10.json"  # a route searched earlier for this verifier
    cached.parent.mkdir(parents=True)
    cached.write_text(json.dumps({"skip": ["mlp.2"], "num_layers": 4, "model": model_identity(pair),
                                  "search": {"objective": "kl-per-cost", "evaluations": 7}}))
    assert pick_route(pair).skip == ("mlp.2",) and pair.route.name == "hub-s10"
    assert "searched" in how_made(pair.route)
    assert load_pair(hub_preset, route="none", device="cpu").route.skip == ()  # a route given is kept


def test_cli_generate_says_which_route_it_used_and_how_it_was_made(hub_preset, capsys):
    assert main(["generate", "--preset", hub_preset, "--prompt", "hi", "--max-new-tokens", "4", "--no-chat"]) == 0
    err = capsys.readouterr().err
    assert "route provisional: 1 sub-layers skipped" in err and "a rule, no search" in err
