"""A cost profile that keeps itself honest (via_sd.core.profile, via_sd.cost.refine): runs start from the best profile
at hand (a shipped prior when this machine has none, labelled so), every run records its passes' milliseconds and
which profile priced it, and a profile off by 2x is corrected by the passes of a few runs."""

import dataclasses
import json

import pytest

from via_sd import DecodeConfig, generate
from via_sd.core import profile
from via_sd.core.profile import learn, profile_at_hand, profile_for, profile_key, profile_path
from via_sd.cost.refine import TOLERANCE, Evidence

CONFIG = DecodeConfig(max_new_tokens=24, chat=False, gamma=3)


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty cache and no profile held by this process, so each test sees only what it makes."""
    monkeypatch.setenv("VIA_SD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(profile, "_MEASURED", {})
    monkeypatch.setattr(profile, "_EVIDENCE", {})
    return tmp_path


def test_a_profile_off_by_2x_is_corrected_by_the_passes_of_a_few_runs(tiny_pair, fresh_cache):
    measured = profile_for(tiny_pair)  # measured here, now
    path = profile_path(profile_key(tiny_pair))

    def batch(seed: int) -> list:
        config = dataclasses.replace(CONFIG, seed=seed)
        return [generate(tiny_pair, f"a prompt {seed}", m, config) for m in ("ar", "sd", "via")]

    # "off by 2x" from what runs measure: the level this machine's runs run at is read first (a tiny pair's 2 ms
    # passes are near what Python costs around them, and another test may be running beside this one)
    first = Evidence()
    for t in batch(99):
        first.add_rounds(t.rounds)
    stale = measured.times(2.0 * first.level(measured), "off by 2x")
    profile._MEASURED[path] = stale  # what a stale profile of a drifted machine would say
    evidence = Evidence()
    for seed in range(3):
        runs = batch(seed)
        assert all("ms" in c for t in runs for r in t.rounds for c in r["calls"]), "a forward without its time"
        assert all(t.costs["source"] == profile_at_hand(tiny_pair).source for t in runs)
        for t in runs:
            evidence.add_rounds(t.rounds)
        learn(tiny_pair, runs)
    assert evidence.level(stale) < 1 - TOLERANCE, "the 2x profile looked honest"
    corrected = profile_at_hand(tiny_pair)
    assert corrected.source.startswith("off by 2x, corrected from the passes of")
    assert abs(evidence.level(corrected) - 1) <= TOLERANCE, f"still off: runs ran at {evidence.level(corrected):.2f}x"
    assert corrected.verify(1) <= (1 - TOLERANCE) * stale.verify(1), "not the stale 2x any more"
    # the shape is the measured one: V(k), c and the slim verifier's fraction, so the predicted speed-ups too
    for k in (2, 4, 8):
        assert corrected.verify(k) / corrected.verify(1) == pytest.approx(stale.verify(k) / stale.verify(1))
        assert corrected.slim(k) / corrected.verify(k) == pytest.approx(stale.slim(k) / stale.verify(k))
    assert corrected.draft(1) / corrected.verify(1) == pytest.approx(stale.draft(1) / stale.verify(1))
    assert json.loads(path.read_text())["source"] == corrected.source  # the next start begins from it


def test_a_run_records_which_profile_priced_it_and_a_prior_spares_the_measurement(tiny_pair, fresh_cache,
                                                                                  monkeypatch):
    from studio.costs import panel

    key = profile_key(tiny_pair)
    stand_in = profile_for(tiny_pair)  # numbers for the prior: as if measured on another machine
    priors = fresh_cache / "priors"
    priors.mkdir()
    (priors / "tiny.json").write_text(json.dumps({"preset": "random", "profile": {
        **stand_in.times(1.3, "measured").to_dict(), "key": {**key, "device_name": "another CPU", "threads": 64}}}))
    monkeypatch.setattr(profile, "PRIORS", priors)
    monkeypatch.setattr(profile, "_MEASURED", {})
    profile_path(key).unlink()
    monkeypatch.setattr(profile, "measure", lambda *a, **k: pytest.fail("measured although a prior fits"))
    assert profile.has_prior("random") and not profile.has_prior("embedded-elsewhere")
    trace = generate(tiny_pair, "hello there", "sd", CONFIG)
    source = trace.costs["source"]
    assert source == "shipped prior, not measured on this machine (another CPU, 64 threads)"
    assert trace.to_dict()["costs"]["source"] == source  # kept with the run, in its download too
    assert source in panel({"sd": trace, "preset": "random"})  # and the page says it


def test_a_profile_written_as_the_shipped_prior_is_what_a_new_machine_prices_with(tiny_pair, fresh_cache,
                                                                                 monkeypatch):
    """`python -m via_sd profile --write-prior PATH` (how assets/profiles/embedded.json is re-measured): the file
    names where and when it was measured, and a machine without its own profile prices with exactly its numbers."""
    from via_sd.cli.profile import write_prior

    measured = profile_for(tiny_pair)
    priors = fresh_cache / "priors"
    priors.mkdir()
    write_prior(str(priors / "random.json"), "random", measured)
    monkeypatch.setattr(profile, "PRIORS", priors)
    about = json.loads((priors / "random.json").read_text())["about"]
    assert profile.has_prior("random") and "measured by python -m via_sd profile" in about, about
    prior = profile.shipped_prior(profile_key(tiny_pair))
    assert prior.verify_ms == measured.verify_ms and prior.draft_ms == measured.draft_ms
    assert prior.source.startswith("shipped prior, not measured on this machine")


def test_a_correction_from_passes_measured_at_different_loads_prices_them_within_tolerance(tiny_pair, fresh_cache):
    """CI's shape: AR's 1-row passes ran while another job held a core (slow), SD's 4-row passes ran quiet, so the
    medians per point fall with rows. Brought to one common load, the passes keep the profile's shape (no run timed
    1 and 4 rows together) and the curve prices them within tolerance, non-decreasing."""

    stale = profile_for(tiny_pair).times(2.0, "off by 2x")
    evidence = Evidence()
    for i in range(24):
        evidence.add_rounds([{"calls": [{"model": "full", "rows": 1, "past": 20 + i, "ms": 9.0 + 0.01 * i}]}])
    for i in range(20):
        evidence.add_rounds([{"calls": [{"model": "full", "rows": 4, "past": 20 + i, "ms": 4.0 + 0.01 * i}]}])
    corrected = evidence.corrected(stale, "corrected")
    ratio, n = evidence.error(corrected)["verify_ms"]
    assert n == 44 and abs(ratio - 1) <= TOLERANCE / 10, ratio
    assert list(corrected.verify_ms) == sorted(corrected.verify_ms), "more rows priced cheaper"
    assert abs(evidence.level(corrected) - 1) <= TOLERANCE


def test_passes_of_runs_at_different_loads_keep_the_slim_verifier_a_fraction_of_the_full_one():
    """A Space's restarts: SD's run timed its verify(4) passes on a busy machine (1.4x), VIA-SD's run its slim(4)
    passes on a quiet one. Corrected curve by curve, slim(4) came out at half of verify(4) where it costs 0.7 of it,
    and VIA-SD was priced ahead of SD where it is not; corrected through each run's load, the fraction stays."""
    from via_sd.cost.model import CostProfile

    rows = range(1, 18)
    truth = CostProfile(verify_ms=tuple(20.0 + 3 * k for k in rows), slim_ms=tuple(0.7 * (20.0 + 3 * k) for k in rows),
                        resume_ms=tuple(0.4 * (20.0 + 3 * k) for k in rows), draft_ms=(6.0, 6.5, 7.0))
    evidence = Evidence()
    for run in range(3):
        sd = [{"calls": [*({"model": "drafter", "rows": 1, "past": 40, "ms": 1.4 * 6.0} for _ in range(3)),
                         {"model": "full", "rows": 4, "past": 40, "ms": 1.4 * truth.verify(4)}]} for _ in range(4)]
        via = [{"calls": [*({"model": "drafter", "rows": 1, "past": 40, "ms": 6.0} for _ in range(3)),
                          {"model": "slim", "rows": 4, "past": 40, "ms": truth.slim(4)},
                          {"model": "full", "rows": 2, "past": 40, "resume": True, "ms": truth.resume(2)}]}
               for _ in range(4)]
        evidence.add_rounds(sd)
        evidence.add_rounds(via)
    stale = truth.times(2.0, "off by 2x")
    assert evidence.level(stale) < 1 - TOLERANCE, "the 2x profile looked honest"
    corrected = evidence.corrected(stale, "corrected")
    assert corrected.slim(4) / corrected.verify(4) == pytest.approx(0.7, rel=0.05)
    assert corrected.resume(2) / corrected.verify(2) == pytest.approx(0.4, rel=0.05)
    assert truth.verify(4) <= corrected.verify(4) <= 1.4 * truth.verify(4), "not at a load the runs ran at"
    assert corrected.draft(1) / corrected.verify(4) == pytest.approx(6.0 / truth.verify(4), rel=0.05)
    assert abs(evidence.level(corrected) - 1) <= 0.10
    assert all(ratio == pytest.approx(1.0) for ratio, _ in evidence.error(corrected).values()), "the runs' shape"


def test_runs_correct_the_level_and_report_the_shape_they_disagree_with():
    """A few short runs re-fitting V(k), c or the slim fraction made the predicted speed-ups worse (the module's
    docstring): a profile whose shape the runs disagree with keeps it, at their level, and `error` says where."""
    from via_sd.cost.model import CostProfile
    from via_sd.cost.refine import keep_honest

    rows = range(1, 18)
    profile = CostProfile(verify_ms=tuple(20.0 + 3 * k for k in rows), slim_ms=tuple(14.0 + 2 * k for k in rows),
                          resume_ms=tuple(8.0 + k for k in rows), draft_ms=(6.0, 6.5, 7.0), source="measured")
    evidence = Evidence()
    for _ in range(3):  # the runs ran 1.5x slower, and their slim passes 1.3x dearer still
        evidence.add_rounds([{"calls": [{"model": "drafter", "rows": 1, "past": 40, "ms": 1.5 * 6.0},
                                        {"model": "slim", "rows": 3, "past": 40, "ms": 1.3 * 1.5 * profile.slim(3)},
                                        {"model": "full", "rows": 3, "past": 40, "ms": 1.5 * profile.verify(3)}]}])
    honest = keep_honest(profile, evidence, "measured")
    assert honest.source == "measured, corrected from the passes of 3 runs on this machine"
    assert honest.verify(3) == pytest.approx(1.5 * profile.verify(3))
    assert honest.slim(3) / honest.verify(3) == pytest.approx(profile.slim(3) / profile.verify(3))
    error = evidence.error(honest)
    assert error["slim_ms"][0] == pytest.approx(1 / 1.3) and error["verify_ms"][0] == pytest.approx(1.0)
    assert keep_honest(honest, evidence, "measured") is honest, "a profile at the runs' level is kept as it is"
