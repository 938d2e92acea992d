"""What a Space builds from: its generated Dockerfile mounts pre-requirements.txt and requirements.txt one at a time
and runs pip on each before the repository is copied in, so neither may name another file or a local path."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pins(name: str) -> list[str]:
    lines = (ROOT / name).read_text(encoding="utf-8").splitlines()
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


def test_the_space_requirements_stand_alone_and_carry_the_model_wheels():
    for name in ("requirements.txt", "pre-requirements.txt"):
        for line in pins(name):
            assert not line.startswith(("-r", "--requirement", "-c", "--constraint", "-e", ".", "/", "file:")), \
                f"{name}: {line!r} needs another file of the repository, which a Space's build does not have yet"
    models = pins("requirements-models.txt")
    assert models and set(models) <= set(pins("requirements.txt")), "requirements.txt lacks model wheels"
