"""The structured-output compiler against the real tokenizer: grammars cached by schema hash, a
schema llguidance cannot compile named by its JSON pointer, and masks that follow the schema
(checked token by token against the tokenizer's own bytes)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llguidance")

from trtpipe.runtime.errors import RequestError  # noqa: E402
from trtpipe.runtime.sample.grammar import GrammarCompiler, consume  # noqa: E402
from trtpipe.runtime.sample.processors import apply_bitmask  # noqa: E402
from trtpipe.runtime.sample.structured import StructuredOutput  # noqa: E402


@pytest.fixture(scope="module")
def compiler(default_artifact):
    from trtpipe.runtime.artifact.manifest import load_manifest

    m = load_manifest(default_artifact, verify_hashes=False)
    return GrammarCompiler(Path(m.path(m.tokenizer_file)).read_text(encoding="utf-8"), 49152, 2)


def test_grammars_are_cached_by_schema_hash(compiler):
    a = {"type": "object", "properties": {"x": {"type": "integer"}}}
    h0, m0 = compiler.hits, compiler.misses
    g1 = compiler.compile(StructuredOutput.json_schema(a))
    g2 = compiler.compile(StructuredOutput.json_schema(json.dumps(a, indent=2)))  # same schema, other spacing
    assert g1 == g2 and (compiler.hits - h0, compiler.misses - m0) == (1, 1)
    assert StructuredOutput.json_schema(a).key != StructuredOutput.json_object().key


@pytest.mark.parametrize(
    "schema,path,reason",
    [
        ({"type": "object", "properties": {"code": {"type": "string", "pattern": "(?<=x)a"}}},
         "/properties/code/pattern", "look-around"),
        ({"type": "wat"}, "/type", "wat"),
        ({"type": "object", "properties": {"x": {"$ref": "#/defs/missing"}}}, "/properties/x/$ref", "missing"),
    ],
)  # fmt: skip
def test_an_uncompilable_schema_names_its_path(compiler, schema, path, reason):
    with pytest.raises(RequestError) as e:
        compiler.compile(StructuredOutput.json_schema(schema))
    msg = str(e.value)
    assert e.value.field == "response_format" and f"at {path} = " in msg and reason in msg and "Fix" in msg


def test_masks_follow_the_schema_token_by_token(compiler, default_artifact):
    """Walk a valid document's tokens: each is allowed by the mask before it; a token that
    breaks the schema is masked; after the document only EOS is allowed."""
    from trtpipe.runtime.artifact.tokenizer import Tokenizer

    tok = Tokenizer.from_file(Path(default_artifact) / "tokenizer.json")
    so = StructuredOutput.json_schema({"type": "object", "properties": {"n": {"type": "integer", "maximum": 9}},
                                       "required": ["n"], "additionalProperties": False})  # fmt: skip
    m = compiler.matcher(so)
    doc = tok.encode('{"n": 7}', add_special_tokens=False)
    for t in doc:
        mask = compiler.fill_bitmask([m], [0], 1)
        logits = np.zeros((1, 49152), np.float32)
        apply_bitmask(logits, mask, np.array([0]))
        assert logits[0, t] == 0.0, tok.token_bytes(t)
        assert np.isinf(logits[0]).sum() > 40000  # almost everything is masked at every step
        assert consume(m, t) is None
    logits = np.zeros((1, 49152), np.float32)
    apply_bitmask(logits, compiler.fill_bitmask([m], [0], 1), np.array([0]))
    assert np.flatnonzero(logits[0] == 0.0).tolist() == [2]  # complete: only EOS
    m2 = compiler.matcher(so)
    assert consume(m2, tok.encode("[", add_special_tokens=False)[0]) is not None  # "[" is not an object
