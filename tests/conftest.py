"""Shared fixtures: the device and backend parametrizations, seeding and the hypothesis profile."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, settings

from ropelib import native

settings.register_profile(
    "ropelib", max_examples=30, deadline=None, database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
settings.load_profile("ropelib")


@pytest.fixture(params=["cpu", "cuda"])
def device(request) -> torch.device:
    """Every available device; the CUDA cases skip cleanly on a machine without a GPU."""
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("CUDA is not available on this machine")
    return torch.device(request.param)


@pytest.fixture(params=["native", "eager"])
def backend(request):
    """Run a test with ropelib's compiled CPU kernel and again with its eager paths.

    A missing compiler fails the native case rather than skipping it: the project's machines
    have one, and a silent fallback would leave the kernel untested.
    """
    if request.param == "native":
        assert native.unavailable_reason() is None, native.unavailable_reason()
    previous = native.set_enabled(request.param == "native")
    yield request.param
    native.set_enabled(previous)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
