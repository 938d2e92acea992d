"""The slim verifier, routes, model loading, the trace contract and bad input."""

import json
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from via_sd import DecodeConfig, ModelLoadError, Thresholds, Trace, generate, load_pair, tiny_random_pair
from via_sd.core.pair import char_tokenizer
from via_sd.core.routing import resolve_route
from via_sd.core.shared_vocab import load_tokenizer, tokenizer_difference


def test_slim_verifier_shares_the_verifiers_weights(tiny_routed_pair):
    verifier_storage = {p.untyped_storage().data_ptr() for p in tiny_routed_pair.verifier.parameters()}
    slim_params = list(tiny_routed_pair.slim.parameters())
    assert slim_params and all(p.untyped_storage().data_ptr() in verifier_storage for p in slim_params)
    skipped = tiny_routed_pair.verifier.model.layers[1].self_attn.q_proj.weight
    assert all(p is not skipped for p in slim_params)


def test_slim_with_route_none_equals_the_verifier(tiny_pair):
    ids = tiny_pair.tokenizer("hello there", return_tensors="pt").input_ids
    with torch.no_grad():
        full = tiny_pair.verifier(ids).logits
    slim = tiny_pair.slim(ids, past_key_values=DynamicCache()).logits
    torch.testing.assert_close(slim, full, rtol=0, atol=1e-5)


def test_slim_with_a_route_differs_and_caches_only_the_layers_it_runs(tiny_routed_pair):
    ids = tiny_routed_pair.tokenizer("hello there", return_tensors="pt").input_ids
    cache = DynamicCache()
    slim = tiny_routed_pair.slim(ids, past_key_values=cache).logits
    with torch.no_grad():
        full = tiny_routed_pair.verifier(ids).logits
    assert not torch.allclose(slim, full)
    filled = [i for i, layer in enumerate(cache.layers) if layer.get_seq_length() > 0]
    assert filled == [0, 2, 3]  # attn.1 is skipped


def test_slim_incremental_decoding_matches_one_pass(tiny_routed_pair):
    ids = tiny_routed_pair.tokenizer("incremental", return_tensors="pt").input_ids
    one = tiny_routed_pair.slim(ids, past_key_values=DynamicCache()).logits
    cache = DynamicCache()
    first = tiny_routed_pair.slim(ids[:, :6], past_key_values=cache).logits
    rest = tiny_routed_pair.slim(ids[:, 6:], past_key_values=cache).logits
    torch.testing.assert_close(torch.cat([first, rest], 1), one, rtol=1e-4, atol=1e-4)


def test_routes_validate_and_round_trip(tmp_path):
    route = resolve_route(["mlp.2", "attn.1", "attn.1"], num_layers=4)
    assert route.skip == ("attn.1", "mlp.2") and route.skip_fraction == 0.25
    path = tmp_path / "r.json"
    path.write_text(route.to_json())
    again = resolve_route(str(path), num_layers=4)
    assert again.skip == route.skip and again.name == "r"
    for bad, words in [(["attn.0"], "first or last"), (["mlp.3"], "first or last"), (["ffn.2"], "unknown sub-layer"),
                       (["attn.9"], "outside"), ("no-such-route", "unknown route")]:
        with pytest.raises(ValueError, match=words):
            resolve_route(bad, num_layers=4)


def test_trace_invariants_and_exact_json_round_trip(tiny_routed_pair):
    cfg = DecodeConfig(gamma=4, max_new_tokens=40, chat=False, thresholds=Thresholds(0.8, 0.3, "draft"))
    for method in ("ar", "sd", "via"):
        trace = generate(tiny_routed_pair, "round trip", method, cfg)
        assert Trace.from_json(trace.to_json()) == trace
        assert "".join(t["text"] for t in trace.tokens) == trace.text
        assert [t["id"] for t in trace.tokens] == trace.token_ids
        assert sum(trace.summary["tier_counts"].values()) == trace.summary["new_tokens"] == len(trace.tokens)
        assert trace.summary["full_calls"] == sum(r["full_called"] for r in trace.rounds)
        for r in trace.rounds:
            assert len(r["candidates"]) <= cfg.gamma
            assert min(r["start_ms"], r["draft_ms"], r["slim_ms"], r["full_ms"], r["other_ms"]) >= 0
            assert all(c["decision"] in ("accepted", "kept", "replaced", "discarded") for c in r["candidates"])
        assert trace.schema == "via-sd-trace/1" and trace.config["thresholds"]["accept"] == 0.8
        assert trace.models["route"] == tiny_routed_pair.route.name


def test_not_a_trace_is_a_clear_error():
    for text in ["{", "[]", json.dumps({"schema": "other"})]:
        with pytest.raises(ValueError, match="not a VIA-SD trace"):
            Trace.from_json(text)


@pytest.mark.parametrize("kwargs, words", [
    ({"gamma": 0}, "gamma"), ({"max_new_tokens": 0}, "max_new_tokens"), ({"max_new_tokens": 100000}, "max_new_tokens"),
    ({"temperature": -1.0}, "temperature"), ({"top_p": 0.0}, "top_p"),
])
def test_bad_decode_settings_say_what_to_change(kwargs, words):
    with pytest.raises(ValueError, match=words):
        DecodeConfig(**kwargs)


def test_bad_thresholds_and_prompts_are_clear_errors(tiny_pair):
    with pytest.raises(ValueError, match="out of order"):
        Thresholds(accept=0.2, escalate=0.5)
    with pytest.raises(ValueError, match="from 0 to 1"):
        Thresholds(accept=1.5)
    with pytest.raises(ValueError, match="signal"):
        Thresholds(signal="vibes")
    with pytest.raises(ValueError, match="empty"):
        generate(tiny_pair, "   ", "via")
    with pytest.raises(ValueError, match="method"):
        generate(tiny_pair, "hi", "beam")
    with pytest.raises(ValueError, match="shorten the prompt"):
        generate(tiny_pair, "x" * 2100, "ar", DecodeConfig(chat=False))


def test_unknown_preset_and_unreadable_models_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown preset"):
        load_pair("huge")
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_pair(drafter=str(tmp_path / "missing.gguf"), verifier=str(tmp_path / "missing.gguf"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="config.json"):
        load_pair(drafter=str(tmp_path / "empty"), verifier=str(tmp_path / "empty"))


def save_tiny_pair(folder):
    """The tiny random pair saved as two model folders, as a person would bring their own; returns their paths."""
    pair = tiny_random_pair()
    for name, model in (("drafter", pair.drafter), ("verifier", pair.verifier)):
        model.save_pretrained(folder / name)
        pair.tokenizer.save_pretrained(folder / name)
    return str(folder / "drafter"), str(folder / "verifier")


def test_pairs_load_from_local_folders_and_mismatched_tokenizers_are_refused(tmp_path):
    drafter, verifier = save_tiny_pair(tmp_path)
    loaded = load_pair(drafter=drafter, verifier=verifier, route=["attn.1"], device="cpu")
    cfg = DecodeConfig(max_new_tokens=12, chat=False)
    assert generate(loaded, "hello", "sd", cfg).token_ids == generate(loaded, "hello", "ar", cfg).token_ids
    assert loaded.route.skip == ("attn.1",)

    other = char_tokenizer()
    other.add_tokens(["world"])  # "world" becomes one token for this "verifier" only
    other.save_pretrained(tmp_path / "verifier")
    with pytest.raises(ValueError, match=r"drafter .* and verifier .* do not share a tokenizer: vocabularies differ "
                                         r"\(drafter 98, verifier 99\): 1 only in the verifier's \('world'\)"):
        load_pair(drafter=drafter, verifier=verifier, device="cpu")


def test_one_tokenizer_in_both_folders_is_read_once_and_any_other_byte_of_it_makes_it_two(tmp_path, monkeypatch):
    import via_sd.core.pair as pair_module
    from via_sd.core.shared_vocab import same_tokenizer_files

    drafter, verifier = save_tiny_pair(tmp_path)  # one tokenizer saved twice: the same files
    reads = []
    monkeypatch.setattr(pair_module, "load_tokenizer", lambda source: reads.append(source) or load_tokenizer(source))
    Path(drafter, "chat_template.jinja").write_text("{{ messages[0]['content'] }}")  # another chat template alone
    assert same_tokenizer_files(drafter, verifier)  # does not change how text becomes ids: still one tokenizer
    load_pair(drafter=drafter, verifier=verifier, route=["attn.1"], device="cpu")
    assert reads == [verifier]
    config = Path(verifier, "tokenizer_config.json")
    config.write_text(config.read_text().replace("{", "{ ", 1))  # the same tokenizer, one byte more: read both
    assert not same_tokenizer_files(drafter, verifier)
    reads.clear()
    load_pair(drafter=drafter, verifier=verifier, route=["attn.1"], device="cpu")
    assert reads == [drafter, verifier]


def test_special_tokens_and_ids_are_compared_and_nothing_is_loaded_before(tmp_path):
    """A vocabulary whose special tokens differ is refused by name, before either model's weights are read (here
    the verifier folder has none: the tokenizer check must come first)."""
    drafter, _ = save_tiny_pair(tmp_path)
    verifier = tmp_path / "no-weights"
    verifier.mkdir()
    (verifier / "config.json").write_text((tmp_path / "verifier" / "config.json").read_text())
    other = char_tokenizer()
    other.add_special_tokens({"additional_special_tokens": ["<|im_end|>"]})
    other.save_pretrained(verifier)
    with pytest.raises(ValueError, match="vocabularies differ .*only in the verifier's \\('<\\|im_end\\|>'\\)"):
        load_pair(drafter=drafter, verifier=str(verifier), device="cpu")
    marked = char_tokenizer()  # the same vocabulary, but "#" is a special token of this verifier's
    marked.add_special_tokens({"additional_special_tokens": ["#"]})
    marked.save_pretrained(verifier)
    with pytest.raises(ValueError, match=r"special tokens differ \(drafter 2, verifier 3\): 1 only in the verifier's "
                                         r"\('#'\)"):
        load_pair(drafter=drafter, verifier=str(verifier), device="cpu")
    assert tokenizer_difference(char_tokenizer(), char_tokenizer()) is None


def test_a_pair_without_a_route_says_so_and_finds_one_searched_later(tmp_path, capsys):
    from via_sd import NO_ROUTE, NoRouteWarning
    from via_sd.__main__ import main
    from via_sd.route_search import model_identity, pick_route, route_cache_dir

    drafter, verifier = save_tiny_pair(tmp_path)
    with pytest.warns(NoRouteWarning, match="no slim route yet: the slim verifier is the full model"):
        pair = load_pair(drafter=drafter, verifier=verifier, device="cpu")
    assert pair.route.skip == () and pair.route.meta["missing"] and NO_ROUTE.startswith("no slim route yet")
    assert main(["generate", "--drafter", drafter, "--verifier", verifier, "--prompt", "hi", "--weights", "fp32",
                 "--gamma", "2", "--max-new-tokens", "4", "--no-chat"]) == 0
    err = capsys.readouterr().err
    assert f"warning: {NO_ROUTE}" in err and f"route --drafter {drafter} --verifier {verifier}" in err

    searched = {"skip": ["mlp.2"], "num_layers": 4, "model": model_identity(pair)}  # as the app's search caches one
    route_cache_dir().mkdir(parents=True, exist_ok=True)
    (route_cache_dir() / "tiny-s10.json").write_text(json.dumps(searched))
    try:
        assert pick_route(pair).skip == ("mlp.2",) and not pair.route.meta.get("missing")
    finally:
        (route_cache_dir() / "tiny-s10.json").unlink()
