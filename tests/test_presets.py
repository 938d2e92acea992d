"""Presets are chosen on one prompt set and reported on another, and the app states what the second measured."""

import json
from pathlib import Path

from via_sd import THRESHOLD_PRESETS

PROMPTS = Path(__file__).resolve().parent.parent / "assets" / "prompts"


def _prompts(name: str) -> list[str]:
    return [json.loads(line)["prompt"] for line in (PROMPTS / name).read_text().splitlines() if line.strip()]


def test_tuning_and_held_out_prompts_share_nothing_with_each_other_or_the_quick_bench():
    tuning, held_out, mixed = _prompts("tuning.jsonl"), _prompts("held_out.jsonl"), _prompts("mixed.jsonl")
    assert len(tuning) >= 10 and len(held_out) >= 10
    assert not set(held_out) & (set(tuning) | set(mixed))
    tasks = {json.loads(line)["task"] for line in (PROMPTS / "held_out.jsonl").read_text().splitlines() if line}
    assert tasks == {"code", "math", "qa", "summarization", "translation"}


def test_the_preset_control_states_each_tuned_presets_held_out_speed_and_agreement():
    from studio.lab import held_out_results, threshold_preset_info

    held = held_out_results()
    assert held["prompts"].endswith("held_out.jsonl") and held["pairs"] >= 10 and "--record" in held["command"]
    assert set(held["presets"]) == set(THRESHOLD_PRESETS) - {"lossless"}  # lossless is plain SD, tuned on nothing
    info = threshold_preset_info()
    for name, result in held["presets"].items():
        assert f"{name} {result['speedup_vs_ar']:.2f}× AR at agreement {result['agreement']:.3f}" in info
    assert f"held-out prompts, never tuned on ({held['pairs']} paired runs, {held['date']})" in info


def test_the_readme_states_fastests_held_out_figures_as_recorded():
    from studio.lab import held_out_results

    held = held_out_results()["presets"]["fastest"]
    readme = (PROMPTS.parent.parent / "README.md").read_text(encoding="utf-8")
    assert f"**{held['speedup_vs_ar']:.2f}× AR at agreement {held['agreement']:.3f}**" in readme
