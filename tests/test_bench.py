"""The benchmark, end to end on tiny random models: every field, paired ratios, bad prompt files,
sweeps and their frontier, fidelity, forward-call accounting, and the GPU cost script on CPU."""

import importlib.util
import json
import statistics
from pathlib import Path

import pytest
import torch

from via_sd import DecodeConfig, Thresholds, bench, generate, tiny_random_pair
from via_sd.__main__ import main
from via_sd.bench.fidelity import measure_fidelity

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [{"task": "code", "prompt": "def f(x):"}, {"task": "prose", "prompt": "The quick brown fox"}]
CFG = DecodeConfig(gamma=4, max_new_tokens=20, chat=False, thresholds=Thresholds(accept=0.8, escalate=0.3, signal="draft"))
METRICS = ["tokens_per_s", "speedup_vs_ar", "speedup_vs_sd", "mean_accepted_length", "rejection_rate",
           "acceptance_by_position", "full_calls_per_token", "tier_shares", "peak_memory_mb", "peak_memory_kind",
           "agreement", "mean_logprob", "logprob_delta_vs_ar", "identical_to_ar", "phase_shares", "ms_per_call"]


@pytest.fixture(scope="module")
def pair():
    return tiny_random_pair(seed=0, route=["attn.1", "mlp.2"])


@pytest.fixture(scope="module")
def result(pair):
    return bench.run_bench(pair, PROMPTS, methods=["ar", "sd", "via", "hf"], config=CFG, repeats=2)


def test_bench_json_holds_every_run_and_every_metric(pair, result):
    result = json.loads(json.dumps(result))  # everything survives JSON
    assert len(result["runs"]) == 4 * len(PROMPTS) * 2
    for method in ("ar", "sd", "via", "hf"):
        for group in ("all", "code", "prose"):
            assert set(METRICS) <= set(result["summary"][method][group])
    s = {m: result["summary"][m]["all"] for m in ("ar", "sd", "via", "hf")}
    # lossless methods give AR's output token for token, and AR is the full model's own greedy choice
    assert s["sd"]["identical_to_ar"] == s["hf"]["identical_to_ar"] == 1.0
    assert s["ar"]["agreement"] == s["sd"]["agreement"] == 1.0
    assert s["ar"]["mean_accepted_length"] == 1.0 and s["ar"]["full_calls_per_token"] == 1.0
    assert s["sd"]["full_calls_per_token"] < 1.0 and s["hf"]["full_calls_per_token"] < 1.0
    assert len(s["via"]["acceptance_by_position"]) == CFG.gamma
    assert sum(s["via"]["tier_shares"].values()) == pytest.approx(1.0)
    assert sum(s["sd"]["phase_shares"].values()) == pytest.approx(1.0)
    assert s["hf"]["mean_accepted_length"] is None  # no trace: only speed, calls and output
    assert set(result["targets"]) == {"sd_vs_hf", "via_vs_sd"}
    assert result["targets"]["sd_vs_hf"]["identical_output"] is True
    assert len(result["per_prompt"]) == len(PROMPTS)
    assert pair.drafter.generation_config.num_assistant_tokens is None  # hf restored the drafter's config
    text = bench.markdown(result)
    assert "| VIA-SD |" in text and "Targets:" in text and "Where the time goes" in text


def test_ratios_come_from_paired_runs_and_runs_are_interleaved(result):
    runs = result["runs"]
    tps = {(r["method"], r["prompt_index"], r["repeat"]): r["tokens_per_s"] for r in runs}
    for method, base, key in [("via", "sd", "speedup_vs_sd"), ("sd", "ar", "speedup_vs_ar"),
                              ("hf", "ar", "speedup_vs_ar")]:
        pairs = [tps[(method, i, rep)] / tps[(base, i, rep)] for i in range(len(PROMPTS)) for rep in range(2)]
        assert result["summary"][method]["all"][key] == pytest.approx(statistics.median(pairs))
        code = [tps[(method, 0, rep)] / tps[(base, 0, rep)] for rep in range(2)]
        assert result["summary"][method]["code"][key] == pytest.approx(statistics.median(code))
        assert result["per_prompt"][0]["methods"][method][key] == pytest.approx(statistics.median(code))
    groups = {}
    for r in runs:
        groups.setdefault((r["repeat"], r["prompt_index"]), []).append(r)
    firsts = []
    for group in groups.values():  # one run of each method in turn, back to back
        orders = sorted(r["order"] for r in group)
        assert orders == list(range(orders[0], orders[0] + 4))
        assert sorted(r["method"] for r in group) == ["ar", "hf", "sd", "via"]
        firsts.append(min(group, key=lambda r: r["order"])["method"])
    assert len(set(firsts)) > 1  # the order rotates


def test_whole_runs_read_x_ar_over_the_replies_that_ran_every_token_and_over_all_time(result):
    """A reply that ends early pays both prompt reads for fewer tokens: the report also reads SD / AR over the
    runs whose AR reply ran all max_new_tokens, and over every run's summed wall time."""
    from via_sd.bench.report import _whole_runs_md

    result = json.loads(json.dumps(result))
    wall = {(r["method"], r["prompt_index"], r["repeat"]): r["wall_ms"] for r in result["runs"]}
    for r in result["runs"]:  # prompt 1's replies end early in both repeats (SD's and HF's where AR's does)
        if r["prompt_index"] == 1:
            r["new_tokens"] = CFG.max_new_tokens - 3
        if (r["method"], r["prompt_index"], r["repeat"]) == ("via", 0, 0):  # VIA's output is not AR's: its own length
            r["new_tokens"] = CFG.max_new_tokens - 2
        r["tokens_per_s"] = 1000.0 * r["new_tokens"] / r["wall_ms"]  # as a run records it (bench/calls.py)
    line = _whole_runs_md(result)[0]
    whole = statistics.median(wall[("ar", 0, k)] / wall[("sd", 0, k)] for k in range(2))
    summed = sum(wall[("ar", i, k)] for i in range(2) for k in range(2)) / \
        sum(wall[("sd", i, k)] for i in range(2) for k in range(2))
    assert line.startswith(f"Whole runs: the AR reply ran all {CFG.max_new_tokens} new tokens on 1 of 2 prompt(s); ")
    assert f"SD {whole:.2f}× AR over those, {summed:.2f}× over all tokens and time" in line
    assert "VIA-SD " in line and "HF assisted " in line and line in bench.markdown(result)
    rate = {(r["method"], r["prompt_index"], r["repeat"]): r["new_tokens"] / r["wall_ms"] for r in result["runs"]}
    via = statistics.median(rate[("via", 0, k)] / rate[("ar", 0, k)] for k in range(2))  # by rate: VIA's output
    assert f"VIA-SD {via:.2f}× AR over those" in line  # may hold another number of tokens than AR's


def test_a_bad_prompt_line_is_an_error_naming_the_line(tmp_path, capsys):
    good = json.dumps({"task": "qa", "prompt": "Why is the sky blue?"})
    cases = {"not json": "line 3: not valid JSON", json.dumps({"task": "qa"}): 'line 3: "prompt"',
             json.dumps(["a", "b"]): "line 3: expected an object",
             json.dumps({"task": "", "prompt": "x"}): 'line 3: "task"'}
    for bad, message in cases.items():
        path = tmp_path / "prompts.jsonl"
        path.write_text(f"{good}\n\n{bad}\n{good}\n")
        with pytest.raises(ValueError, match=message):
            bench.load_prompts(path)
    assert main(["bench", "--preset", "random", "--prompts", str(path), "--repeats", "1"]) == 2
    assert "line 3" in capsys.readouterr().err
    path.write_text(f"{good}\n{good}\n")
    assert [p["line"] for p in bench.load_prompts(path)] == [1, 2]
    with pytest.raises(ValueError, match="does not exist"):
        bench.load_prompts(tmp_path / "missing.jsonl")


def test_sweep_frontier_points_are_not_dominated_and_route_is_restored(pair):
    before = pair.slim
    sweep = bench.run_sweep(pair, ["hello world", "abc def"], CFG, accept=[0.5, 0.9], escalate=[0.0, 0.3, 0.6],
                            signals=["slim", "draft"], routes=[None, ["attn.2"]], warmup=0)
    assert pair.slim is before
    assert len(sweep["points"]) == 2 * 2 * 5  # (0.5, 0.6) is skipped: escalate above accept
    assert all(p["escalate"] <= p["accept"] for p in sweep["points"])
    assert {p["route"] for p in sweep["points"]} == {"attn.1,mlp.2", "attn.2"}
    front = sweep["frontier"]
    assert front and all(p["pareto"] for p in front)

    def dominates(q, p):
        return q["speedup"] >= p["speedup"] and q["fidelity"] >= p["fidelity"] and (
            q["speedup"] > p["speedup"] or q["fidelity"] > p["fidelity"])

    for p in sweep["points"]:
        if p in front:
            assert not any(dominates(q, p) for q in sweep["points"])
        else:
            assert any(dominates(q, p) for q in front)
    sd_runs = {(r["prompt_index"], r["repeat"]): r["tokens_per_s"] for r in sweep["runs"] if r["label"] == "sd"}
    mine = [r for r in sweep["runs"] if r["label"] == "point0"]
    assert sweep["points"][0]["speedup"] == pytest.approx(
        statistics.median(r["tokens_per_s"] / sd_runs[(r["prompt_index"], r["repeat"])] for r in mine))
    assert sweep["sd"]["fidelity"] == 1.0
    assert sweep["best"] is None or sweep["best"]["fidelity"] >= bench.FIDELITY_TARGET
    assert "frontier" in bench.markdown_sweep(sweep)
    json.dumps(sweep)


def test_fidelity_of_ar_against_itself_is_perfect_and_via_matches_a_token_by_token_check(pair):
    ar = generate(pair, "hello world", "ar", CFG)
    same = measure_fidelity(pair, ar, reference=ar)
    assert same["agreement"] == 1.0 and same["first_disagreement"] is None
    assert same["logprob_delta"] == 0.0 and same["identical"] and same["common_prefix"] == len(ar.token_ids)
    via = generate(pair, "hello world", "via", DecodeConfig(gamma=4, max_new_tokens=20, chat=False,
                                                             thresholds=Thresholds(accept=0.3, escalate=0.0, signal="draft")))
    f = measure_fidelity(pair, via.to_dict(), reference=ar)
    prompt = pair.encode("hello world", chat=False)
    agree, logq = [], []
    with torch.no_grad():  # one forward per position, as a reference for the single teacher-forced pass
        for i, token in enumerate(via.token_ids):
            q = torch.log_softmax(pair.verifier(torch.tensor([prompt + via.token_ids[:i]])).logits[0, -1], -1)
            agree.append(int(q.argmax()) == token)
            logq.append(float(q[token]))
    assert f["agreement"] == pytest.approx(sum(agree) / len(agree))
    assert f["mean_logprob"] == pytest.approx(sum(logq) / len(logq), abs=1e-4)
    assert f["agreement"] < 1.0 and f["first_disagreement"] == agree.index(False)
    assert f["logprob_delta"] < 0 and not f["identical"]


def test_fidelity_of_several_runs_reads_the_prompt_once_and_a_stop_ends_it_between_passes(pair, monkeypatch):
    import via_sd.bench.fidelity as fidelity

    config = DecodeConfig(gamma=4, max_new_tokens=40, chat=False,
                          thresholds=Thresholds(accept=0.3, escalate=0.0, signal="draft"))
    ar = generate(pair, "hello world", "ar", config)
    runs = {"via": generate(pair, "hello world", "via", config), "sd": generate(pair, "hello world", "sd", config)}
    alone = {m: measure_fidelity(pair, t, reference=ar) for m, t in runs.items()}
    fed = []
    hook = pair.verifier.register_forward_pre_hook(lambda m, a, kw: fed.append(kw["input_ids"].shape[1]),
                                                   with_kwargs=True)
    try:
        monkeypatch.setattr(fidelity, "CHUNK", 7)  # output passes of 7 rows: the same scores as one pass
        together = fidelity.measure_fidelities(pair, runs, reference=ar)
        prompt = len(pair.encode("hello world", chat=False))
        assert fed.count(prompt) == 1 and sum(fed) == prompt + 3 * 39  # the prompt once; three outputs less one row
        for m in runs:  # fp32 tiny models batch attention: float sums may round differently, nothing else
            assert together[m].keys() == alone[m].keys()
            for key, value in alone[m].items():
                assert together[m][key] == (pytest.approx(value, abs=1e-5) if isinstance(value, float) else value)
        asked = []
        stopped = fidelity.measure_fidelities(pair, runs, reference=ar, stop=lambda: asked.append(1) or len(asked) > 2)
        assert stopped is None and len(asked) == 3  # asked before every pass, ended at the third
    finally:
        hook.remove()
    with pytest.raises(ValueError, match="different prompt"):
        fidelity.measure_fidelities(pair, runs, reference=generate(pair, "another", "ar", config))


class _Recording:
    """The slim verifier, noting how many tokens each call feeds."""

    def __init__(self, slim, log):
        self.slim, self.log = slim, log

    def __getattr__(self, name):
        return getattr(self.slim, name)

    def __call__(self, input_ids, **kwargs):
        self.log.append(input_ids.shape[1])
        return self.slim(input_ids=input_ids, **kwargs)


def test_call_lengths_recorded_in_a_trace_are_what_the_models_were_fed(pair):
    assert pair.costs  # measured (or read) before the hooks go on: the profile's own passes are not a run's
    fed = {"drafter": [], "slim": [], "full": []}
    hooks = [pair.drafter.model.embed_tokens.register_forward_pre_hook(  # the lean forward (lean.py) embeds too
                 lambda m, a: fed["drafter"].append(a[0].shape[1])),
             pair.verifier.register_forward_pre_hook(lambda m, a, kw: fed["full"].append(kw["input_ids"].shape[1]),
                                                     with_kwargs=True)]
    original = pair.slim
    pair.slim = _Recording(original, fed["slim"])
    try:
        for method, th in [("ar", Thresholds()), ("sd", Thresholds()), ("via", Thresholds(0.8, 0.3, "slim")),
                           ("via", Thresholds(0.6, 0.2, "draft"))]:
            for prompt in ("hello world", "x = 1\n"):
                for log in fed.values():
                    log.clear()
                # progressive=False: the slim and full verifier run as separate models (their own forwards)
                trace = generate(pair, prompt, method, DecodeConfig(gamma=4, max_new_tokens=23, chat=False,
                                                                    thresholds=th, progressive=False))
                assert bench.call_lengths(trace) == fed, (method, th.signal, prompt)
    finally:
        pair.slim = original
        for h in hooks:
            h.remove()


def test_per_call_costs_leave_the_prompt_reads_out_and_report_them_once_a_run(pair):
    """SD's drafter reads its prompt with its first call, in the round of its first drafts (with gamma="auto" round
    1, after the round that read the verifier's): its ms a call are its steps, from each call's own clock, and the
    prompt read is a cost of its own."""
    from via_sd.bench.calls import call_costs

    trace = generate(pair, PROMPTS[1]["prompt"], "sd", CFG)
    drafter = [(r["round"], c) for r in trace.rounds for c in r["calls"] if c["model"] == "drafter"]
    reads = [c for k, c in drafter if c["prompt"]]
    assert len(reads) == 1 and reads[0]["rows"] > 1 and drafter[0][1] is reads[0]  # its first call
    costs = call_costs(trace)
    assert costs["steady"]["calls"]["drafter"] == len(drafter) - 1
    assert costs["steady"]["ms"]["drafter"] == pytest.approx(sum(c["ms"] for _, c in drafter[1:]))
    assert costs["prompt_reads"]["ms"]["drafter"] == reads[0]["ms"] > 0
    assert costs["prompt_reads"]["fed"]["drafter"] == reads[0]["rows"] and costs["prompt_reads"]["fed"]["full"] > 0

    result = bench.run_bench(pair, PROMPTS, methods=["ar", "sd"], config=CFG, repeats=1)
    sd = [r for r in result["runs"] if r["method"] == "sd"]
    steps = sum(r["steady"]["ms"]["drafter"] for r in sd) / sum(r["steady"]["calls"]["drafter"] for r in sd)
    analysis = result["analysis"]["costs"]
    assert analysis["drafter_ms_per_call"] == pytest.approx(steps)
    assert analysis["drafter_prompt_ms_per_run"] == pytest.approx(
        statistics.mean(r["prompt_reads"]["ms"]["drafter"] for r in sd))
    assert result["summary"]["ar"]["all"]["prompt_ms_per_run"]["drafter"] is None  # AR's drafter reads nothing
    assert "- prompt reads, once a run: SD's drafter " in bench.markdown(result)


def test_projection_prices_each_recorded_forward_call(result):
    costs = {"lengths": [1, 5], "ms": {"drafter": [1.0, 2.0], "full": [10.0, 12.0], "slim": {"r": [5.0, 6.0]}},
             "routes": {"r": ["attn.1", "mlp.2"]}, "device_name": "test", "pair": "tiny", "dtype": "float32"}
    proj = bench.project(result, costs)
    full = lambda n: 10.0 + 0.5 * (n - 1)  # noqa: E731  (linear through the two measured points)
    for run in (r for r in result["runs"] if r["method"] == "ar"):
        p = next(p for p in proj["runs"] if (p["method"], p["prompt_index"], p["repeat"]) ==
                 ("ar", run["prompt_index"], run["repeat"]))
        # AR: the first call reads the prompt, then one token per call
        assert run["call_lengths"]["full"] == [run["prompt_tokens"]] + [1] * (run["new_tokens"] - 1)
        assert p["ms"] == pytest.approx(full(run["prompt_tokens"]) + 10.0 * (run["new_tokens"] - 1))
    assert set(proj["summary"]) == {"ar", "sd", "via"} and "projected" in proj["label"]
    assert proj["summary"]["ar"]["speedup_vs_ar"] == 1.0
    assert bench.project(result, {**costs, "routes": {"r": ["attn.2"]}})["notes"]  # unknown route: said, not guessed


def test_gpu_script_runs_on_cpu_with_tiny_configs_and_feeds_the_bench(tmp_path, result):
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    out = tmp_path / "costs.json"
    assert gpu_check.main(["--device", "cpu", "--tiny", "--iters", "1", "--warmup", "0", "--context", "8",
                           "--lengths", "1,2,5", "--out", str(out)]) == 0
    costs = json.loads(out.read_text())
    assert costs["schema"] == "via-sd-gpu-costs/1" and costs["device"] == "cpu" and costs["lengths"] == [1, 2, 5]
    assert costs["routes"] == {"attn.1,mlp.2": ["attn.1", "mlp.2"]}
    for series in (costs["ms"]["drafter"], costs["ms"]["full"], costs["ms"]["slim"]["attn.1,mlp.2"]):
        assert len(series) == 3 and all(v > 0 for v in series)
    proj = bench.project(result, costs)
    assert all(v["tokens_per_s"] > 0 for v in proj["summary"].values()) and not proj["notes"]


def test_cli_bench_and_sweep_write_json_and_print_the_table_last(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps(p) for p in PROMPTS) + "\n")
    out = tmp_path / "out.json"
    common = ["--preset", "random", "--route", "attn.1,mlp.2", "--prompts", str(prompts), "--max-new-tokens", "12",
              "--gamma", "3", "--no-chat", "--repeats", "1", "--warmup", "0"]
    assert main(["bench", *common, "--methods", "ar,sd,via", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["methods"] == ["ar", "sd", "via"] and data["config"]["gamma"] == 3 and len(data["runs"]) == 6
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1].startswith("| VIA-SD |") and printed[-5].startswith("| method |")  # the table comes last
    assert main(["bench", *common, "--sweep", "accept=0.5:0.9:0.4,escalate=0.0:0.2:0.2", "--signals", "draft",
                 "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["kind"] == "sweep" and len(data["points"]) == 4
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1].startswith("| SD |") and any(line.startswith(("Fastest", "No point")) for line in printed)


def test_cli_bench_writes_every_run_before_the_report_and_a_failed_report_loses_none(tmp_path, capsys, monkeypatch):
    """gamma="auto" (the default) reports per-position acceptance over the rounds it drafted; a report that fails
    after the measurement leaves every run on disk and says where."""
    from via_sd.cli import bench as cli_bench

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps(p) for p in PROMPTS[:1]) + "\n")
    out = tmp_path / "out.json"
    common = ["bench", "--preset", "random", "--prompts", str(prompts), "--max-new-tokens", "8", "--no-chat",
              "--repeats", "1", "--warmup", "0", "--methods", "ar,sd,via", "--json", str(out)]
    assert main(common) == 0
    data = json.loads(out.read_text())
    assert data["config"]["gamma"] == "auto" and len(data["runs"]) == 3
    assert "Per-position acceptance" in capsys.readouterr().out

    def broken(result):
        raise KeyError("a column")

    out.unlink()
    monkeypatch.setattr(cli_bench, "markdown", broken)
    assert main(common) == 1
    assert len(json.loads(out.read_text())["runs"]) == 3
    assert f"every run is in {out}" in capsys.readouterr().err


def test_hf_assisted_generation_mirrors_gamma_and_draft_stop_and_matches_ar(pair):
    drafter_calls = {}
    for draft_stop in (0.0, 0.9):
        cfg = DecodeConfig(gamma=4, max_new_tokens=20, chat=False, draft_stop=draft_stop)
        hf, _ = bench.run_once(pair, "hello world", "hf", cfg)
        sd, _ = bench.run_once(pair, "hello world", "sd", cfg)
        assert hf["token_ids"] == generate(pair, "hello world", "ar", cfg).token_ids == sd["token_ids"]
        assert hf["full_calls"] == sd["full_calls"]  # the same rounds: one verifier pass each
        drafter_calls[draft_stop] = hf["drafter_calls"]
    assert drafter_calls[0.9] < drafter_calls[0.0]  # the early stop reached transformers
    assert pair.drafter.generation_config.assistant_confidence_threshold is None
