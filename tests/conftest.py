"""Shared fixtures: tiny random models for mechanics, the embedded real pair for integration."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from via_sd import load_pair, tiny_random_pair  # noqa: E402


@pytest.fixture(scope="session")
def tiny_pair():
    """A 2-layer drafter and 4-layer verifier (random weights, character tokenizer), no route."""
    return tiny_random_pair(seed=0)


@pytest.fixture(scope="session")
def tiny_routed_pair():
    """The same tiny pair with a slim verifier that skips two sub-layers."""
    return tiny_random_pair(seed=0, route=["attn.1", "mlp.2"])


@pytest.fixture(scope="session")
def embedded_pair():
    """The real Qwen2.5-Coder 0.5B -> 1.5B pair from the PyPI wheels (built into a cache on first use)."""
    return load_pair("embedded")
