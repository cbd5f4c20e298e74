"""``pip install trtpipe`` (the runtime side) resolves on a Jetson (linux aarch64, Python 3.10,
JetPack 6) and on x86-64: the wheel is built from this tree and its dependencies are resolved by
pip against the package index for each target (``--only-binary=:all:``, wheels only).

pip evaluates environment markers against the interpreter that runs it, not against
``--platform`` / ``--python-version`` (pypa/pip#10050), so the resolve runs pip with its marker
environment set to the target's (as pex does): otherwise the ``platform_machine`` markers that
choose ``onnxruntime`` vs ``onnxruntime-gpu`` would be judged for this x86-64 machine.

Needs the index (and downloads setuptools to build the wheel): skipped when it cannot be reached.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PIP_TIMEOUT_S = 240

# pip with its PEP 508 marker environment replaced by the target's (argv[1], JSON)
PIP_FOR_TARGET = textwrap.dedent("""
    import json, sys
    import pip._vendor.packaging.markers as markers
    env = markers.default_environment()
    env.update(json.loads(sys.argv[1]))
    markers.default_environment = lambda: dict(env)
    from pip._internal.cli.main import main
    sys.exit(main(sys.argv[2:]))
""")

TARGETS = {
    # JetPack 6: Ubuntu 22.04 (glibc 2.35), Python 3.10, aarch64
    "jetson-aarch64-py310": (
        {
            "platform_machine": "aarch64",
            "python_version": "3.10",
            "python_full_version": "3.10.12",
            "sys_platform": "linux",
            "platform_system": "Linux",
        },
        "aarch64",
        "3.10",
    ),
    "x86_64-py310": (
        {
            "platform_machine": "x86_64",
            "python_version": "3.10",
            "python_full_version": "3.10.12",
            "sys_platform": "linux",
            "platform_system": "Linux",
        },
        "x86_64",
        "3.10",
    ),
}

pytestmark = pytest.mark.network


def _index_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


def _pip(args: list[str], env_markers: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable] + (["-c", PIP_FOR_TARGET, json.dumps(env_markers)] if env_markers else ["-m", "pip"])
    try:
        r = subprocess.run(cmd + args, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.skip(f"pip did not finish in {PIP_TIMEOUT_S} s (index too slow to reach)")
    if r.returncode != 0 and any(
        w in r.stderr for w in ("NewConnectionError", "Max retries exceeded", "Temporary failure in name resolution")
    ):
        pytest.skip("the package index cannot be reached")
    return r


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The trtpipe wheel, built from a copy of the tree (a build writes build/ and egg-info)."""
    if not _index_reachable():
        pytest.skip("pypi.org:443 cannot be reached")
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for pkg in ("pipeline", "runtime", "plugins"):
        shutil.copytree(ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path_factory.mktemp("dist")
    r = _pip(["wheel", "--no-deps", "-q", "-w", str(dist), str(src)])
    assert r.returncode == 0, r.stderr[-3000:]
    (whl,) = dist.glob("trtpipe-*.whl")
    return whl


def resolve(wheel: Path, target: str, tmp_path: Path) -> dict[str, str]:
    """{distribution name (lowercase): wheel file name} that pip would install for ``target``."""
    env, machine, py = TARGETS[target]
    platforms = [f"manylinux_2_{v}_{machine}" for v in range(35, 16, -1)] + [f"manylinux2014_{machine}"]
    report = tmp_path / "report.json"
    args = [
        "install",
        "--dry-run",
        "--ignore-installed",
        "--only-binary=:all:",
        "--python-version",
        py,
        "--implementation",
        "cp",
        "--target",
        str(tmp_path / "t"),
        "--report",
        str(report),
        "-q",
    ]
    for p in platforms:
        args += ["--platform", p]
    r = _pip(args + [str(wheel)], env)
    assert r.returncode == 0, f"pip could not resolve trtpipe for {target}:\n{r.stderr[-3000:]}"
    doc = json.loads(report.read_text())
    return {
        i["metadata"]["name"].lower().replace("_", "-"): i["download_info"]["url"].rsplit("/", 1)[-1]
        for i in doc["install"]
    }


def test_runtime_resolves_on_jetson_aarch64_python310(wheel, tmp_path):
    got = resolve(wheel, "jetson-aarch64-py310", tmp_path)
    assert "onnxruntime" in got and "onnxruntime-gpu" not in got  # no aarch64 GPU wheel on the index
    assert "cp310" in got["onnxruntime"] and "aarch64" in got["onnxruntime"]
    for name in ("numpy", "tokenizers", "pydantic-core", "pyyaml"):
        assert "aarch64" in got[name], (name, got[name])
    # the runtime side never pulls torch; TensorRT on a Jetson is JetPack's system package
    assert not any(n.startswith(("torch", "tensorrt")) for n in got), sorted(got)


def test_runtime_resolves_on_x86_64(wheel, tmp_path):
    got = resolve(wheel, "x86_64-py310", tmp_path)
    assert "onnxruntime-gpu" in got and "onnxruntime" not in got
    assert "x86_64" in got["onnxruntime-gpu"]
    assert not any(n.startswith(("torch", "tensorrt")) for n in got), sorted(got)


# -- the runtime side alone: validate and generate with no torch and no onnx -------------------------------

RUNTIME_ONLY_TIMEOUT_S = 540


@pytest.mark.slow
def test_validate_and_generate_on_a_runtime_only_install(wheel, default_artifact, tmp_path):
    """A fresh venv with `pip install trtpipe` (the runtime side: no build, plots or serve extras)
    runs `trtpipe generate` and `trtpipe validate` on the built default artifact; torch, onnx and
    matplotlib are not importable there, and validate says in one line that it skipped the plots."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py, cli = venv / "bin" / "python", venv / "bin" / "trtpipe"
    try:
        r = subprocess.run(
            [str(py), "-m", "pip", "install", "-q", str(wheel)], capture_output=True, text=True, timeout=PIP_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        pytest.skip(f"pip did not finish in {PIP_TIMEOUT_S} s (index too slow to reach)")
    assert r.returncode == 0, r.stderr[-3000:]
    probe = "import importlib.util as u; print([m for m in ('torch', 'onnx', 'matplotlib') if u.find_spec(m)])"
    assert subprocess.run([str(py), "-c", probe], capture_output=True, text=True).stdout.strip() == "[]"
    art = tmp_path / "art"  # a view of the artifact: validate writes its report under it
    art.mkdir()
    for f in default_artifact.iterdir():
        if f.name != "validate":
            (art / f.name).symlink_to(f)

    gen = subprocess.run(
        [str(cli), "generate", str(art), "The capital of France is", "--max-new-tokens", "8"],
        capture_output=True,
        text=True,
        timeout=RUNTIME_ONLY_TIMEOUT_S,
        cwd=tmp_path,
    )
    assert gen.returncode == 0, gen.stderr[-3000:]
    assert "Paris" in gen.stdout
    recipe = ROOT / "recipes" / "smollm2-135m-cpu.yaml"
    val = subprocess.run(
        [str(cli), "validate", str(recipe), "--artifact", str(art), "--scenario", "code"],
        capture_output=True,
        text=True,
        timeout=RUNTIME_ONLY_TIMEOUT_S,
        cwd=tmp_path,
    )
    assert val.returncode in (0, 1), val.stderr[-3000:]  # 1: a budget missed on a loaded host; still a run
    report = json.loads((art / "validate" / "scenarios-code" / "report.json").read_text())
    assert report["gate"]["correctness_passed"] is True and report["gate"]["kv_leak_free"] is True
    assert report["plots"] == []
    assert "plots skipped: matplotlib is not installed" in val.stderr + val.stdout
    assert "pip install 'trtpipe[plots]'" in val.stderr + val.stdout
