"""The optional llama.cpp bench peer (via_sd/bench/llama_peer.py): skipped with one plain line where
llama-cpp-python is not installed (as in CI), never failing the bench; and, where it is installed, a short real run
on the embedded pair's GGUF files."""

import pytest

from via_sd import DecodeConfig, bench
from via_sd.__main__ import main
from via_sd.bench import llama_peer

PROMPTS = [{"task": "code", "prompt": "def f(x):"}]
CFG = DecodeConfig(gamma=2, max_new_tokens=4, chat=False)
LLAMA = ["llama-ar", "llama-sd", "llama-lookup"]


@pytest.fixture
def absent(monkeypatch):
    """llama-cpp-python looks absent here, installed or not."""
    monkeypatch.setattr(llama_peer, "installed", lambda: False)


def test_the_bench_skips_the_peer_with_a_plain_line_when_it_is_not_installed(absent, tiny_pair, capsys):
    result = bench.run_bench(tiny_pair, PROMPTS, methods=["ar", *LLAMA], config=CFG, repeats=1, warmup=0,
                             fidelity=False)
    assert result["methods"] == ["ar"] and {r["method"] for r in result["runs"]} == {"ar"}
    assert result["skipped_methods"] == dict.fromkeys(LLAMA, llama_peer.NOT_INSTALLED)
    assert llama_peer.NOT_INSTALLED == "llama.cpp peer not installed: pip install -r requirements-peers.txt"
    assert llama_peer.NOT_INSTALLED in capsys.readouterr().err
    assert llama_peer.NOT_INSTALLED in bench.markdown(result)


def test_the_command_line_says_so_and_loads_nothing_when_only_the_peer_was_asked_for(absent, capsys, monkeypatch):
    import via_sd.cli.bench as cli

    monkeypatch.setattr(cli, "pair_from_args", lambda *a, **k: pytest.fail("loaded a pair for nothing to run"))
    assert main(["bench", "--preset", "random", "--methods", "llama-ar,llama-sd", "--no-fidelity"]) == 0
    assert llama_peer.NOT_INSTALLED in capsys.readouterr().err


def test_a_pair_without_the_embedded_gguf_files_skips_the_peer(monkeypatch, tiny_pair):
    monkeypatch.setattr(llama_peer, "installed", lambda: True)
    why = llama_peer.peer_missing(tiny_pair)
    assert why.startswith("llama.cpp peer skipped: it runs the embedded pair's GGUF files")
    methods, skipped = bench.run.without_missing_peers(tiny_pair, ["ar", "llama-ar"])
    assert methods == ["ar"] and skipped == {"llama-ar": why}


def test_the_peer_methods_are_known_to_the_bench_but_not_run_by_default():
    assert set(LLAMA) <= set(bench.BENCH_METHODS) and not set(LLAMA) & set(bench.OUR_METHODS)
    with pytest.raises(ValueError, match="unknown methods"):
        bench.run_bench(None, PROMPTS, methods=["llama-unknown"], config=CFG)


@pytest.mark.embedded
@pytest.mark.skipif(not llama_peer.installed(), reason=llama_peer.NOT_INSTALLED)
def test_the_peer_runs_on_the_embedded_gguf_files_when_installed(embedded_pair):
    cfg = DecodeConfig(max_new_tokens=8)  # the peer alone: ours would measure the pair's cost profile first
    result = bench.run_bench(embedded_pair, [{"task": "code", "prompt": "Write a Python function that adds two "
                                              "numbers."}], methods=LLAMA, config=cfg, repeats=1, warmup=0,
                             fidelity=False)
    runs = {r["method"]: r for r in result["runs"]}
    assert set(runs) == set(LLAMA) and not result["skipped_methods"]
    for m in LLAMA:
        assert runs[m]["new_tokens"] == 8 and runs[m]["tokens_per_s"] > 0
        assert runs[m]["prompt_ids_match_ours"], "llama.cpp read another prompt than ours"
    assert runs["llama-sd"]["drafted"] > 0 and runs["llama-sd"]["drafter_calls"] > 0
    assert "llama.cpp peer" in bench.markdown(result)
