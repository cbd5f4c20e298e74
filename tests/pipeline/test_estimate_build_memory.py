"""``trtpipe estimate``'s host memory to build against hand-computed values and the measurement
it follows (docs/estimate.md, "Host memory to build": today's CPU build measured stage by stage on
synthetic Q4_0 Llamas with bench/build_memory.py and bench/build_stage_peaks.py; no build here)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from trtpipe.pipeline.cli.main import main
from trtpipe.pipeline.estimate import build_host_bytes, estimate, linear_params, total_params
from trtpipe.pipeline.estimate.render import _total_rows  # the memory table's last rows
from trtpipe.pipeline.recipe import RECIPES_DIR, load_recipe
from trtpipe.pipeline.targets import GiB, HostMeasurement, get_target
from trtpipe.runtime.artifact.model_config import ModelConfig

LLAMA = dict(architecture="llama", rope_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=4096)
SMOLLM2 = ModelConfig(
    **{**LLAMA, "rope_theta": 100000.0, "max_position_embeddings": 8192},
    name="SmolLM2-135M",
    num_layers=30,
    hidden_size=576,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    intermediate_size=1536,
    vocab_size=49152,
    tie_word_embeddings=True,
)
# recipes/synthetic-llama-mid-cpu.yaml's model (bench/synthetic_gguf.py --layers 2 --hidden 2048
# --heads 16 --ffn 5504): Llama-2-7B's head_dim and vocabulary, untied head.
MID = ModelConfig(
    **LLAMA,
    name="synthetic-llama-mid",
    num_layers=2,
    hidden_size=2048,
    num_heads=16,
    num_kv_heads=16,
    head_dim=128,
    intermediate_size=5504,
    vocab_size=32000,
    tie_word_embeddings=False,
)
# docs/estimate.md, "Measured on a synthetic Llama (issue 44)": `trtpipe build` peak RSS of the
# mid shape (process tree, bench/build_memory.py, 2-core AMD EPYC Zen 3, 2026-12-08).
MEASURED_MID_BUILD_PEAK = 5.14e9
# The stated tolerance of the per-parameter formula against that measurement (its coefficients are
# rounded to whole bytes per parameter and were fitted on the 1- and 2-layer shapes).
TOLERANCE = 0.10


def test_smollm2_build_memory_by_hand():
    """Linear: per layer q,o 2 x 576 x 576 + k,v 2 x 576 x 192 + FFN 3 x 576 x 1536 = 3,538,944,
    x 30 = 106,168,320; the rest: the tied embedding 49152 x 576 = 28,311,552 + norms 61 x 576 =
    35,136. CPU: 11 B and 28 B per parameter + 0.26 GB; TensorRT: 4 x 4 B x all + 768 MiB."""
    assert linear_params(SMOLLM2) == 30 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536) == 106_168_320
    cpu = 11 * 106_168_320 + 28 * (28_311_552 + 35_136) + 260_000_000
    assert build_host_bytes(SMOLLM2, "cpu") == cpu == 2_221_558_784
    assert build_host_bytes(SMOLLM2, "orin") == 16 * 134_515_008 + 768 * 2**20 == 2_957_546_496


def test_mid_synthetic_build_memory_by_hand():
    """Linear: per layer q,k,v,o 4 x 2048 x 2048 + FFN 3 x 2048 x 5504 = 50,593,792, x 2 =
    101,187,584; the rest: embedding and head 2 x 32000 x 2048 = 131,072,000 + norms 5 x 2048."""
    assert linear_params(MID) == 2 * (4 * 2048 * 2048 + 3 * 2048 * 5504) == 101_187_584
    assert total_params(MID) == 101_187_584 + 131_072_000 + 10_240 == 232_269_824
    cpu = 11 * 101_187_584 + 28 * (131_072_000 + 10_240) + 260_000_000
    assert build_host_bytes(MID, "cpu") == cpu == 5_043_366_144
    assert build_host_bytes(MID, "a100") == 16 * 232_269_824 + 768 * 2**20 == 4_521_623_552


def test_mid_synthetic_estimate_against_the_measured_build_peak():
    """The CPU formula predicts the measured 5.14 GB within the stated 10 % (0.98x); the old
    4 x fp32 formula (4.52 GB, 0.88x) did not."""
    predicted = build_host_bytes(MID, "cpu")
    assert predicted / MEASURED_MID_BUILD_PEAK == pytest.approx(0.981, abs=1e-3)
    assert abs(predicted / MEASURED_MID_BUILD_PEAK - 1) <= TOLERANCE
    assert abs(build_host_bytes(MID, "orin") / MEASURED_MID_BUILD_PEAK - 1) > TOLERANCE


def test_llama2_7b_cpu_and_tensorrt_figures():
    """Linear 32 x (4 x 4096^2 + 3 x 4096 x 11008) = 6,476,005,376; the rest 2 x 32000 x 4096 +
    65 x 4096 = 262,410,240: CPU 78.84 GB (docs/estimate.md's ~79 GB extrapolation); TensorRT
    (unmeasured) 4 x 4 B x 6,738,415,616 + 768 MiB = 108.62 GB."""
    c = get_target("orin")  # the estimate picks the figure by the target's family
    cfg = ModelConfig(
        **LLAMA,
        name="Llama-2-7B",
        num_layers=32,
        hidden_size=4096,
        num_heads=32,
        num_kv_heads=32,
        head_dim=128,
        intermediate_size=11008,
        vocab_size=32000,
        tie_word_embeddings=False,
    )
    assert build_host_bytes(cfg, "cpu") == 11 * 6_476_005_376 + 28 * 262_410_240 + 260_000_000 == 78_843_545_856
    assert build_host_bytes(cfg, c.family) == 16 * 6_738_415_616 + 768 * 2**20 == 108_619_956_224


def test_estimate_prints_the_formula_and_its_source(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no validate report here
    res = CliRunner().invoke(main, ["estimate", str(RECIPES_DIR / "llama2-7b-orin.yaml")])
    assert res.exit_code == 0, res.output
    out = " ".join(res.output.split())
    assert "108.62 GB" in out and out.count("unmeasured") == 2  # the table row and the note
    host = HostMeasurement(
        bandwidth_bytes_per_s=30e9,
        fp32_flops_per_s=179e9,
        memory_total_bytes=24 * GiB,
        memory_available_bytes=20 * GiB,
        num_cpus=2,
    )
    r = load_recipe(RECIPES_DIR / "llama2-7b-orin.yaml", check_files=False)
    e = estimate(r, r.model.architecture.to_model_config(), get_target("cpu", host=host))
    assert e.build_host_bytes == 78_843_545_856
    (row,) = [row for row in _total_rows(e, r) if row[0] == "host memory to build"]
    assert row[1] == "78.84 GB" and "11 B x linear params + 28 B x embedding/head params" in row[2]
    assert "docs/estimate.md" in row[2]
