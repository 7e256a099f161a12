"""Shared fixtures: the device parametrization, seeding and the hypothesis profile."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, settings

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


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
