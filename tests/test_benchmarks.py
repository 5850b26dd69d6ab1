"""benchmarks/gpu.py without a GPU: it refuses to run and says why, and its report (every section, the device
named) replaces the GPU section of benchmarks/README.md in place, keeping everything around it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def gpu_module():
    spec = importlib.util.spec_from_file_location("gpu_bench", ROOT / "benchmarks" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def timing(ms: float, mb: float) -> dict:
    return {"ms": ms, "mb": mb}


def result() -> dict:
    names = ["flash full causal", "FlexAttention window", "ours local"]
    return {
        "device": "NVIDIA H100 80GB HBM3",
        "torch": "2.11.0",
        "cuda": "13.0",
        "date": "2026-11-24",
        "command": "python benchmarks/gpu.py",
        "attention": [
            {"n": n, **{k: timing(0.5 * i + n / 4096, 10.0 * i) for i, k in enumerate(names)}} for n in (1024, 4096)
        ],
        "decoder": {"tokens": 16384, "full": timing(19.6, 900), "local w256": timing(8.0, 600)},
        "additive": {"n": 4096, "dot": timing(1.0, 50), "additive": timing(7.5, 200), "ratio": 7.5},
        "encoder": {
            "T": 2048,
            "batch": 8,
            "d_model": 1024,
            "layers": 8,
            "ours": {"tokens_per_s": 2e5, "mfu": 0.45},
            "nn.TransformerEncoder": {"tokens_per_s": 1.9e5, "mfu": 0.43},
        },
        "run_vs_loop": [
            {
                "compile": False,
                "fused_adamw": False,
                "ours_tokens_per_s": 3.1e5,
                "loop_tokens_per_s": 3.2e5,
                "ratio": 0.97,
            }
        ],
    }


def test_the_report_names_the_device_and_replaces_only_its_section(tmp_path):
    gpu = gpu_module()
    text = gpu.markdown(result())
    assert "NVIDIA H100 80GB HBM3" in text and "| 4,096 | " in text and "2.45x** faster" in text
    assert "**7.5x** (target at most 10x)" in text and "MFU 45.0%" in text and "**0.970x**" in text
    readme = tmp_path / "README.md"
    readme.write_text(f"# Benchmarks\n\nbefore\n\n{gpu.BEGIN}\nNot measured yet.\n{gpu.END}\n\nafter\n")
    gpu.write_readme_section(text, readme)
    body = readme.read_text()
    assert "Not measured yet" not in body and "before" in body and "after" in body and text in body
    gpu.write_readme_section("second\n", readme)  # again: replaced, not appended
    assert readme.read_text().count(gpu.BEGIN) == 1 and text not in readme.read_text()
    committed = (ROOT / "benchmarks" / "README.md").read_text()
    assert committed.count(gpu.BEGIN) == 1 and committed.count(gpu.END) == 1


def test_a_section_that_failed_or_did_not_run_is_reported_as_such_and_the_rest_kept():
    gpu = gpu_module()
    r = result()
    r["additive"] = {"error": "OutOfMemoryError: CUDA out of memory."}
    del r["run_vs_loop"]  # stopped by a time limit before it
    text = gpu.markdown(r)
    assert (
        "failed: `OutOfMemoryError: CUDA out of memory.`" in text
        and "ablate run` against a plain PyTorch loop**: not run" in text
    )
    assert "2.45x** faster" in text and "MFU 45.0%" in text  # the measured sections stay


def test_the_flexattention_anchors_visit_the_blocks_ours_do():
    """The anchors compute what ours compute: per head, the same key blocks (partial and full) as our window and
    per-head dilated masks (models.flex.block_structure). A dilated mask built for H=None would hold head 0's
    blocks for every head: the peer would skip half the keys of the heads at dilation 2 (the first H100 run did)."""
    import torch

    from models import flex

    gpu = gpu_module()
    n = 1024
    window, dilated = gpu.peer_masks(n, device="cpu", compiled=False)
    for mask, dilations in ((window, (1,) * gpu.H), (dilated, gpu.DILATIONS)):
        num, _, full, _ = flex.block_structure(n, gpu.WINDOW, dilations, causal=True)  # (1, 1 or H, N)
        assert torch.equal(mask.kv_num_blocks.expand(1, gpu.H, -1), num.expand(1, gpu.H, -1)), dilations
        assert torch.equal(mask.full_kv_num_blocks.expand(1, gpu.H, -1), full.expand(1, gpu.H, -1)), dilations
    assert not torch.equal(dilated.kv_num_blocks[0, 0], dilated.kv_num_blocks[0, -1])  # the heads differ


def test_without_cuda_it_refuses_with_the_reason():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the benchmark would run")
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--quick"], capture_output=True, text=True
    )
    assert out.returncode == 2 and "needs a CUDA device" in out.stderr
