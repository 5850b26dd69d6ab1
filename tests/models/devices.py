"""Test helpers for devices: ``@cuda`` marks a test that needs a CUDA device and skips it, saying so, without one."""

from __future__ import annotations

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()


def cuda(fn):
    """Mark ``cuda`` (select with -m cuda) and skip where torch sees no CUDA device."""
    fn = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device: torch.cuda.is_available() is False here")(fn)
    return pytest.mark.cuda(fn)
