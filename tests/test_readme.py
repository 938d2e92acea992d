"""Every command README.md shows runs, as written but on the tiny random pair where the embedded one is not needed:
the test reads the README's code blocks, so a command that changes without its test fails here."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
# The two set-up commands are what CI itself runs (.ci/run: scripts/setup.sh --dev, then pytest) and what starts
# the app (the browser tests start it); the "From code" snippets need a running app: tests/test_app_api.py runs them.
RUN_ELSEWHERE = ("bash scripts/setup.sh && .venv/bin/python app.py", "bash scripts/setup.sh --dev && .venv/bin/python -m pytest")


def code_blocks() -> list[tuple[str, str, str]]:
    """(section heading, language, code) of every fenced block."""
    blocks, section = [], ""
    for part in re.split(r"(^```\w*\n.*?^```$)", README, flags=re.S | re.M):
        if part.startswith("```"):
            lang, code = re.match(r"```(\w*)\n(.*?)```$", part, re.S).groups()
            blocks.append((section, lang, code))
        else:
            headings = re.findall(r"^## (.+)$", part, re.M)
            section = headings[-1] if headings else section
    return blocks


def shell_commands() -> list[str]:
    return [line.strip() for _, lang, code in code_blocks() if lang == "bash"
            for line in code.splitlines() if line.strip() and not line.strip().startswith("#")]


def on_the_random_pair(command: str) -> str:
    """The command with the tiny random pair for the embedded one and small sizes: the same flags and paths."""
    command = command.replace(".venv/bin/python", sys.executable).replace("--preset embedded", "--preset random")
    if " -m via_sd profile" in command and "--preset" not in command:
        command = command.replace(" profile", " profile --preset random", 1)
    command = re.sub(r"--max-new-tokens \d+", "--max-new-tokens 8", command)
    command = re.sub(r"--repeats \d+", "--repeats 1", command)
    if " -m via_sd bench" in command:
        command += " --limit 2 --warmup 0"
    return command


def _params():
    out = []
    for command in shell_commands():
        if command in RUN_ELSEWHERE:
            continue
        marks = [pytest.mark.embedded] if " -m via_sd setup" in command else []  # prepares the embedded pair itself
        out.append(pytest.param(command, marks=marks, id=command.split("#")[0][:60]))
    return out


def test_the_readme_shows_its_two_commands_and_ci_runs_the_second():
    commands = shell_commands()
    assert all(c in commands for c in RUN_ELSEWHERE)
    assert "bash scripts/setup.sh --dev" in (ROOT / ".ci" / "run").read_text() and ".venv/bin/python -m pytest" in \
        (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("command", _params())
def test_each_readme_command_runs(command, tmp_path):
    shutil.copytree(ROOT / "assets" / "prompts", tmp_path / "assets" / "prompts")  # paths as in the repo
    (tmp_path / "assets" / "routes").mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(["bash", "-c", on_the_random_pair(command)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for out in re.findall(r"--(?:json|out) (\S+)", command):  # every file the command says it writes
        assert (tmp_path / out).stat().st_size > 0, out


def test_every_python_block_is_one_the_api_tests_run():
    """The README's Python blocks sit in its "From code" section, which tests/test_app_api.py runs as a reader would
    (the client snippet against a live app, the engine snippet on the random pair)."""
    python = [(section, code) for section, lang, code in code_blocks() if lang == "python"]
    assert python and all(section == "From code" for section, _ in python)
    api_tests = (ROOT / "tests" / "test_app_api.py").read_text(encoding="utf-8")
    assert 'readme_snippet("gradio_client")' in api_tests and 'readme_snippet("load_pair")' in api_tests


def test_the_readme_colour_key_is_the_palette():
    """The README's key names each token label with the colour the app draws it in (viz/palette.py), every label
    once: a colour changed on one side fails here."""
    from viz.palette import OKABE_ITO, TIER_COLORS

    section = README.split("## What you see", 1)[1].split("\n## ", 1)[0]
    key = {label: colour for colour, label in re.findall(r"([a-z]+(?: [a-z]+)?) \*([^*]+)\*", " ".join(section.split()))}
    colour_names = {hex_: name.replace("_", " ") for name, hex_ in OKABE_ITO.items()}
    assert key == {label: colour_names[hex_] for label, hex_ in TIER_COLORS.items()}


def test_a_fresh_set_up_without_room_says_so_before_it_installs_anything(tmp_path):
    """A full disk made pip report "Connection interrupted" halfway through a model wheel (CI failed so, 2026-12-04):
    the set-up checks its room first and names it, leaving nothing behind."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    done = subprocess.run(["bash", "scripts/setup.sh"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "VIA_SD_SETUP_NEEDS_GB": "1000000"})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "GB free; a fresh set-up needs about 1000000 GB" in done.stderr, done.stderr
    assert not (tmp_path / ".venv").exists(), "a venv made before the check"
