"""Fixtures of the farm tests: a copy of the default recipe's artifact (the suite's session
fixture: the checkout's own when current, else built once, ~85 s) and a tiny Llama (2 layers,
hidden 64, byte vocabulary) whose GPU-target build stops at its build spec in seconds of CPU
time."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

CPU_RECIPE = "smollm2-135m-cpu"


@pytest.fixture(scope="session")
def cpu_artifact_root(default_artifact, tmp_path_factory) -> Path:
    """An artifacts root holding a copy of ``smollm2-135m-cpu/cpu`` (the suite's default
    artifact: the checkout's own when current, else built once per session); build() confirms
    the copy is up to date and skips it."""
    from trtpipe.pipeline.build import build
    from trtpipe.pipeline.recipe import load_recipe, resolve_recipe_path

    root = tmp_path_factory.mktemp("cpu-artifacts")
    shutil.copytree(default_artifact, root / CPU_RECIPE / "cpu", ignore=shutil.ignore_patterns("validate", ".*"))
    res = build(load_recipe(resolve_recipe_path(CPU_RECIPE)), root, log=lambda s: None)
    assert res.skipped, "the copied default artifact was rebuilt"
    return root


def _write_tiny_llama(d: Path) -> None:
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    d.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                   tie_word_embeddings=True, bos_token_id=None, eos_token_id=None)
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
