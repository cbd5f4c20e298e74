"""``trtpipe farm node`` (which target labels a node may advertise) and the build memory that
``trtpipe estimate`` adds for the farm. No Ray cluster needed."""

from __future__ import annotations

import json

from click.testing import CliRunner

from trtpipe.pipeline.cli.main import main
from trtpipe.pipeline.farm.node import GpuInfo, NodeProbe, ray_start_command, refusal

GIB = 2**30


def _probe(platform="x86_64", gpus=(), jetson=None, trt="10.13.0") -> NodeProbe:
    return NodeProbe("n", platform, 8, 64 * GIB, 60 * GIB, tuple(gpus), jetson, trt, None if trt else "No module")


def test_cpu_is_always_honoured():
    assert refusal(_probe(trt=None), "cpu") is None


def test_gpu_labels_need_the_platform_the_sm_and_tensorrt():
    a100 = GpuInfo("NVIDIA A100-SXM4-80GB", 80, 80 * GIB)
    assert refusal(_probe(gpus=[a100]), "a100") is None
    why = refusal(_probe(gpus=[a100]), "h200")
    assert why == "target h200 needs an sm_90 GPU, this machine has NVIDIA A100-SXM4-80GB (sm_80)"
    why = refusal(_probe(gpus=[a100], trt=None), "a100")
    assert why.startswith("TensorRT is not importable here (No module)")
    # an Orin: aarch64, L4T release file; nvidia-smi may list no GPU there
    assert refusal(_probe("aarch64", jetson="# R36 (release), REVISION: 4.0"), "orin") is None
    why = refusal(_probe(trt=None), "orin")
    assert why.split("; ")[:2] == [
        "this machine is x86_64, target orin is aarch64",
        "target orin needs an sm_87 GPU, this machine has no NVIDIA GPU (nvidia-smi absent or empty)",
    ]


def test_ray_start_command():
    assert ray_start_command("orin", "10.0.0.5:6379", num_cpus=4) == [
        "ray",
        "start",
        "--address",
        "10.0.0.5:6379",
        "--resources",
        '{"trtpipe_target_orin": 1}',
        "--num-cpus",
        "4",
    ]
    assert ray_start_command("cpu", None)[:3] == ["ray", "start", "--head"]


def test_farm_node_cli_on_this_machine():
    """This machine: x86-64, no GPU, no TensorRT: cpu yes, orin refused with every reason."""
    r = CliRunner().invoke(main, ["farm", "node", "--target", "cpu", "--address", "127.0.0.1:6379"])
    assert r.exit_code == 0
    assert r.stdout.strip().splitlines()[-1] == (
        "ray start --address 127.0.0.1:6379 --resources '{\"trtpipe_target_cpu\": 1}'"
    )
    r = CliRunner().invoke(main, ["farm", "node", "--target", "orin", "--json"])
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    assert doc["target"] == "orin" and "target orin is aarch64" in doc["refused"]
    assert "refused: this node cannot build target orin" in r.stderr


def test_estimate_adds_the_build_host_memory():
    """SmolLM2-135M by hand: embedding 49152 x 576 (tied) = 28,311,552; per layer q,o 2 x 576 x
    576 + k,v 2 x 576 x 192 + FFN 3 x 576 x 1536 = 3,538,944, x 30 = 106,168,320; norms 61 x 576
    = 35,136; total 134,515,008 parameters -> 4 x 4 B x that + 768 MiB (orin: the TensorRT
    formula, unmeasured; the cpu one is tests/pipeline/test_estimate_build_memory.py)."""
    from trtpipe.pipeline.estimate import estimate, model_config_for
    from trtpipe.pipeline.recipe import load_recipe, resolve_recipe_path
    from trtpipe.pipeline.targets import get_target

    r = load_recipe(resolve_recipe_path("recipes/smollm2-135m-orin.yaml"), check_files=False)
    config = model_config_for(r)
    e = estimate(r, config, get_target("orin"))
    assert e.build_host_bytes == 16 * 134_515_008 + 768 * 2**20
    assert e.to_dict()["build_host_bytes"] == e.build_host_bytes
    assert not any("building needs" in n for n in e.notes)  # 2.96 GB fits a 32 GB Orin
