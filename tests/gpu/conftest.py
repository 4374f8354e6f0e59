"""Fixtures of the GPU model tests."""

import pytest
import torch


@pytest.fixture
def no_tf32():
    """fp32 matmuls and convolutions in full precision, as the references are computed."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
