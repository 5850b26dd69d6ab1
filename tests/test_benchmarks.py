"""benchmarks/gpu.py without a GPU: its smoke run measures every section on the CPU at tiny sizes through the GPU
sections' code paths, checking each of ours against the anchor that computes the same thing; a section is stopped at
its time limit with what it measured kept, and a run resumes the sections still missing; the full run refuses to
start without CUDA and says why; its report (every section, the device named) replaces the GPU section of
benchmarks/README.md in place, keeping everything around it."""

from __future__ import annotations

import importlib.util
import itertools
import json
import re
import subprocess
import sys
import time

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


def test_the_smoke_run_measures_every_section_on_the_cpu_through_the_gpu_code_paths(tmp_path, store):
    """`--smoke` at tiny sizes, compiled through torch.compile's graph capture (``aot_eager``: the recompilations and
    torch's limit on them, without generating kernels): every section ends done, ours give the outputs of the
    FlexAttention anchors written independently with ``create_block_mask``, `ablate run` and the plain loop alternate
    (compiled, fused AdamW and bf16-mixed with clipping: the combination Lightning refused on the first H100), and
    the committed README is left alone."""
    readme = (ROOT / "benchmarks" / "README.md").read_bytes()
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--smoke", "--compiler", "aot_eager"]
    out = subprocess.run(
        [*cmd, "--out", str(tmp_path), "--tracking-uri", store], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    r = json.loads((tmp_path / "smoke" / "gpu.json").read_text())
    gpu = gpu_module()
    assert {name: m["status"] for name, m in r["sections"].items()} == dict.fromkeys(gpu.SECTIONS, "done")
    rows = r["attention"]
    assert [row["n"] for row in rows] == gpu.SMOKE_PLAN["attention"]["lengths"]
    for row in rows:
        assert set(row["max_diff"]) == {ours for ours, _ in gpu.PAIRS}
        assert all(d <= 1e-4 for d in row["max_diff"].values()), row["max_diff"]
        assert all(row[name]["ms"] > 0 for name in ("flash full causal", "ours local", "FlexAttention dilated"))
    assert {"full", "local w64", "full compiled", "local w64 compiled"} <= set(r["decoder"])
    assert {"ours", "nn.TransformerEncoder", "ours compiled", "nn.TransformerEncoder compiled"} <= set(r["encoder"])
    (eager,) = r["run_vs_loop"]
    assert eager["repeats"] == 2 and eager["ratio_range"][0] <= eager["ratio"] <= eager["ratio_range"][1]
    assert eager["ratio"] == pytest.approx(sum(eager["ratios"]) / 2)  # the median of two
    (compiled,) = r["run_vs_loop_compiled"]
    assert compiled["compile"] and compiled["fused_adamw"] and compiled["precision"] == "bf16-mixed"
    assert compiled["last_metrics"]["cost/steps"] == 21  # every step trained: the clip was not refused
    profile = r["profile"]
    assert set(profile["decoder_kernels"]) == {"full", "local w64"} and profile["decoder_bound"]["rest_ms"] > 0
    assert {"dot", "additive chunk 2^10", "additive chunk 2^12"} <= set(profile["additive_chunks"])
    # a packed study on a Ray whose head declares one GPU (none here): 2 cells at once, each cell exactly once
    (level,) = r["packed"]["levels"]
    assert level["cells_per_gpu"] == 2 and level["cells_done"] == level["cells_started"] == 4, level
    assert any("packing: 2 cell(s) at once per GPU (resources.gpus 0.5)" in x for x in level["packing_lines"])
    assert "not shown on a CPU" in out.stdout and "two (4,) slopes and no table" in out.stdout
    assert (ROOT / "benchmarks" / "README.md").read_bytes() == readme


def test_a_compiled_window_holds_no_compilation_where_an_epoch_ends_inside_it(store):
    """torch.compile recompiles at an epoch's last, smaller batch; inside a timed window that compilation was timed as
    training (0.05x on an H200, 2026-11-28, whichever side ran first paying it). The untimed compiled run before the
    repeats keeps every compilation out of both sides' windows, as dynamo's own counter of graphs says."""
    import torch

    from benchmarks import run_vs_loop

    task = {"max_chars": 10000}  # at batch 8 of 64 bytes, the first epoch's last batch is step 17
    run = run_vs_loop.run_config("tiny", 10, 10, 1, "32-true", True, False, task)
    smaller = [step for step, b in run_vs_loop.training_batches(run, 20) if len(b["tokens"]) < 8]  # batch 8
    assert [step for step in smaller if 10 < step <= 20] == [17]
    torch._dynamo.reset()  # the process's earlier compilations of the model would hide the recompilation
    with gpu_module().compiler("aot_eager"):
        r = run_vs_loop.measure("tiny", 10, 1, 1, "32-true", True, False, warm=10, task=task, uri=store)
    assert r["seconds"]["ours_graphs"] == r["seconds"]["loop_graphs"] == [0]
    assert r["graphs_compiled_in_windows"] == 0 and len(r["seconds"]["warmup_s"]) == 1


def test_a_section_past_its_time_limit_is_stopped_and_keeps_what_it_measured(tmp_path, monkeypatch):
    """Stopped between measurements when its time is spent, or by the alarm inside one that holds it past its limit:
    either way its figures so far are written at once, the next section runs, and it is reported as cut off."""
    import torch

    gpu = gpu_module()

    def stepwise(ctx, plan):  # checks its time between measurements
        rows = []
        while True:
            ctx.check()
            rows.append(len(rows))
            ctx.put(rows)
            time.sleep(0.05)

    def stuck(ctx, plan):  # one measurement that never ends: the alarm stops it
        ctx.put({"first": 1.0})
        time.sleep(60)

    monkeypatch.setitem(gpu.RUNS, "decoder", stepwise)
    monkeypatch.setitem(gpu.RUNS, "additive", stuck)
    monkeypatch.setitem(gpu.RUNS, "encoder", lambda ctx, plan: ctx.put({"measured": True}))
    r = {"device": "CPU", "torch": torch.__version__, "cuda": None, "date": "2026-11-27", "command": "test"}
    saved = []
    started = time.monotonic()
    gpu.run_sections(
        r,
        ["decoder", "additive", "encoder"],
        {"decoder": {}, "additive": {}, "encoder": {}},
        {"decoder": 0.3, "additive": 0.3, "encoder": 5},
        torch.device("cpu"),
        lambda: saved.append(json.loads(json.dumps(r, default=str))),
    )
    assert time.monotonic() - started < 10
    meta = r["sections"]
    assert meta["decoder"]["status"] == meta["additive"]["status"] == "cut" and meta["encoder"]["status"] == "done"
    assert len(r["decoder"]) >= 2 and r["additive"] == {"first": 1.0}
    assert any(s.get("additive") == {"first": 1.0} and "encoder" not in s for s in saved)  # written before the next
    r = result()
    r["sections"] = {"encoder": {"status": "cut", "error": "cut off at its time limit of 75 s", "limit_s": 75}}
    text = gpu.markdown(r)
    assert "(MFU 43.0%).\n\n(cut off at its time limit of 75 s: the figures above are what it measured before.)" in text


def test_a_section_resumed_on_another_device_is_labelled_with_the_device_it_ran_on(monkeypatch):
    """The H200 session of 2026-11-27 resumed an H100 file, and its attention section was labelled H100."""
    import torch

    gpu = gpu_module()
    encoder = result()["encoder"]
    monkeypatch.setitem(gpu.RUNS, "encoder", lambda ctx, plan: ctx.put(encoder))
    r = {**result(), "device": "NVIDIA H100 80GB HBM3", "device_now": "CPU (x86_64)"}
    gpu.run_sections(r, ["encoder"], {"encoder": {}}, {"encoder": 5}, torch.device("cpu"), lambda: None)
    assert r["sections"]["encoder"]["device"] == "CPU (x86_64)"
    assert "(This section: CPU (x86_64), torch" in gpu.markdown(r)


def test_a_resumed_run_measures_the_sections_not_done():
    gpu = gpu_module()
    r = result()  # written before sections carried their status: present is done
    r["additive"] = {"error": "OutOfMemoryError: CUDA out of memory."}
    assert gpu.sections_to_run(r, [], resume=True) == ["additive", "run_vs_loop_compiled", "profile", "packed"]
    r["sections"] = {"attention": {"status": "cut"}, "decoder": {"status": "done"}, "encoder": {"status": "failed"}}
    assert gpu.sections_to_run(r, [], resume=True)[:2] == ["attention", "additive"]
    assert "decoder" not in gpu.sections_to_run(r, [], resume=True)
    assert gpu.sections_to_run(r, [], resume=False) == list(gpu.SECTIONS)
    assert gpu.sections_to_run(r, ["encoder"], resume=True) == ["encoder"]
    assert gpu.sections_named(["decoder,encoder", "additive"]) == ["decoder", "encoder", "additive"]
    with pytest.raises(SystemExit, match="unknown section"):
        gpu.sections_named(["decoders"])
    # each call of the session (benchmarks/gpu_session.sh) holds its sections' limits, with 10 s to start
    script = (ROOT / "benchmarks" / "gpu_session.sh").read_text()
    calls = re.findall(r"timeout (\d+) \$PY benchmarks/gpu.py ([^>\\\n]*)", script)
    assert len(calls) == 6, calls
    for timeout, args in calls:
        words = args.split()
        limits = gpu.parse_limits(words[words.index("--limits") + 1] if "--limits" in words else None)
        if "--only" not in words:  # --resume: what `measure` leaves
            words += ["--only", "run_vs_loop_compiled"]
        sections = gpu.sections_named(
            list(itertools.takewhile(lambda w: not w.startswith("--"), words[words.index("--only") + 1 :]))
        )
        assert sum(limits[s] for s in sections) + 10 <= int(timeout), (args, timeout)
