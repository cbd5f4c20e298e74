"""The native engine's boundary (runtime/engines/native_step.py, csrc/forward.c check_step, the
weight sizes checked at load): malformed steps and manifests that disagree with their weights
are refused with an error naming the field, never a crash or a silent wrong answer; the KV pool
and the engine's answers are unchanged afterwards; two engines in one process share nothing."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from trtpipe.plugins.cpu.compile import compiler
from trtpipe.plugins.cpu.isa import host_isa
from trtpipe.runtime.errors import ArtifactError, StepError

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(host_isa() is None or compiler() is None, reason="needs x86-64 AVX2 and a C compiler"),
]

FUZZ_BATCHES = 10_000
# input_ids sets T and context_lens sets S: a wrong length there is reported on an array of the same count
SAME_COUNT = {
    "input_ids": ("input_ids", "positions", "slot_mapping"),
    "context_lens": ("context_lens", "last_token_indices", "query_start_loc", "block_tables"),
}


@pytest.fixture(scope="module")
def engine(default_artifact):
    from trtpipe.runtime.llm import LLM

    return LLM(default_artifact, engine="native", prefix_caching=False).engine


def _valid(nb: int, bs: int, lens=(5, 3)) -> dict[str, np.ndarray]:
    """A prefill step of sequences of ``lens`` tokens in fresh blocks 1, 2, ... (block 0 is the null block)."""
    ids, pos, slots, tables, ctx, qsl, nxt = [], [], [], [], [], [0], 1
    for n in lens:
        table = list(range(nxt, nxt + -(-n // bs)))
        nxt += len(table)
        ids += [(100 + 7 * p) % 1000 for p in range(n)]
        pos += list(range(n))
        slots += [table[p // bs] * bs + p % bs for p in range(n)]
        tables.append(table + [0] * (2 - len(table)))
        ctx.append(n)
        qsl.append(qsl[-1] + n)
    a = dict(
        input_ids=ids, positions=pos, slot_mapping=slots, block_tables=tables, context_lens=ctx,
        query_start_loc=qsl, last_token_indices=[q - 1 for q in qsl[1:]],
    )  # fmt: skip
    return {k: np.asarray(v, np.int64) for k, v in a.items()}


def _step(engine, feeds, logit_indices=None):
    return engine.prefill(SimpleNamespace(feeds=lambda: dict(feeds), logit_indices=logit_indices))


def _value_mutations(nb: int, bs: int, max_pos: int, vocab: int):
    """Each (field, fn(feeds, rng)) makes one value invalid that only C's check can see."""

    def setv(key, idx, value):
        def f(a, rng):
            a[key] = a[key].copy()
            a[key][idx(a, rng)] = value(a, rng)

        return f

    tok = lambda a, r: int(r.integers(len(a["input_ids"])))  # noqa: E731
    seq = lambda a, r: int(r.integers(len(a["context_lens"])))  # noqa: E731
    big = lambda lo: lambda a, r: int(r.choice([-1, -(2**40), lo, lo + int(r.integers(1, 2**31))]))  # noqa: E731
    return [
        ("input_ids", setv("input_ids", tok, big(vocab))),
        ("positions", setv("positions", tok, big(max_pos))),
        ("slot_mapping", setv("slot_mapping", tok, big(nb * bs))),
        ("block_tables", setv("block_tables", lambda a, r: (seq(a, r), 0), big(nb))),
        ("query_start_loc", setv("query_start_loc", lambda a, r: int(r.integers(1, len(a["query_start_loc"]))),
                                 lambda a, r: int(r.choice([0, -1, len(a["input_ids"]) + 1 + int(r.integers(9))])))),
        ("query_start_loc", setv("query_start_loc", lambda a, r: 0, lambda a, r: int(r.integers(1, 4)))),
        ("context_lens", setv("context_lens", seq, lambda a, r: int(r.choice([0, -1, max_pos + 1, 2**40])))),
        ("context_lens", setv("context_lens", seq, lambda a, r: 2 * bs + 1)),  # past its 2-block table
        ("last_token_indices", setv("last_token_indices", seq, lambda a, r: int(r.choice([-1, len(a["input_ids"]), 2**33])))),
    ]  # fmt: skip


def _shape_mutations():
    """Each (field, fn(feeds, rng)) breaks a length, rank or dtype: the Python half's checks."""

    def drop(key):
        return lambda a, r: a.__setitem__(key, a[key][:-1])

    def extra(key):
        return lambda a, r: a.__setitem__(key, np.concatenate([a[key], a[key][-1:]]))

    def dtype(key):
        return lambda a, r: a.__setitem__(key, a[key].astype(r.choice([np.float64, np.float32, np.bool_])))

    keys = ("input_ids", "positions", "slot_mapping", "context_lens", "query_start_loc", "last_token_indices")
    out = [(k, f(k)) for k in keys for f in (drop, extra, dtype)]
    out += [
        ("block_tables", lambda a, r: a.__setitem__("block_tables", a["block_tables"].ravel())),
        ("block_tables", lambda a, r: a.__setitem__("block_tables", a["block_tables"][:, :0])),
        ("block_tables", lambda a, r: a.__setitem__("block_tables", np.concatenate([a["block_tables"]] * 2))),
        ("block_tables", dtype("block_tables")),
        ("positions", lambda a, r: a.pop("positions")),
    ]
    return out


def test_ten_thousand_malformed_steps_are_refused_and_change_nothing(engine):
    """>= 10,000 random malformed steps (wrong lengths, ranks and dtypes; ids, positions, slots and
    block ids out of range; query_start_loc out of order; context lengths past their table): each
    one a StepError naming its field; the pool bit-identical afterwards, and so the logits."""
    m, pool = engine.manifest, engine.pool
    nb, bs, vocab = m.kv.num_blocks, m.kv.block_size, m.model.vocab_size
    good = _valid(nb, bs)
    before = _step(engine, good)
    keys0 = [k.copy() for k in pool.keys[:2]]
    mutations = _value_mutations(nb, bs, engine._limits.max_positions, vocab) + _shape_mutations()
    rng = np.random.default_rng(0)
    refused: dict[str, int] = {}
    for i in range(FUZZ_BATCHES):
        field, mutate = mutations[i % len(mutations)]
        feeds = _valid(nb, bs, lens=tuple(int(x) for x in rng.integers(1, 2 * bs + 1, size=int(rng.integers(1, 4)))))
        mutate(feeds, rng)
        with pytest.raises(StepError, match="step field") as e:
            _step(engine, feeds)
        assert e.value.field.split("[")[0] in SAME_COUNT.get(field, (field,)), (field, str(e.value))
        refused[field] = refused.get(field, 0) + 1
    assert sum(refused.values()) == FUZZ_BATCHES
    for k0, k in zip(keys0, pool.keys[:2], strict=True):
        np.testing.assert_array_equal(k0, k)
    np.testing.assert_array_equal(_step(engine, good), before)


def test_verify_rows_outside_the_step_are_refused(engine):
    m = engine.manifest
    good = _valid(m.kv.num_blocks, m.kv.block_size)
    for rows in ([0, 8], [-1], [[0, 1]]):
        with pytest.raises(StepError, match="logit"):
            _step(engine, good, logit_indices=np.asarray(rows, np.int64))


def test_two_engines_in_one_process_run_at_once_and_match_each_alone(default_artifact):
    """Two engines (their own pools and workspaces) stepping at the same time from two threads
    (ctypes drops the GIL in the call) give the logits each gives alone, bit for bit: no scratch
    is shared (the library held it in process globals before)."""
    from trtpipe.runtime.llm import LLM

    a, b = (LLM(default_artifact, engine="native", prefix_caching=False).engine for _ in range(2))
    m = a.manifest
    steps_a = [_valid(m.kv.num_blocks, m.kv.block_size, lens) for lens in ((30, 17), (3,), (31, 2, 9))]
    steps_b = [_valid(m.kv.num_blocks, m.kv.block_size, lens) for lens in ((1,), (32, 32), (7, 20))]
    alone = [[_step(e, s) for s in steps] for e, steps in ((a, steps_a), (b, steps_b))]
    together: list[list[np.ndarray]] = [[], []]

    def run(i, e, steps):
        for _ in range(3):
            together[i] += [_step(e, s) for s in steps]

    threads = [threading.Thread(target=run, args=(i, e, s)) for i, (e, s) in enumerate(((a, steps_a), (b, steps_b)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(2):
        assert len(together[i]) == 9
        for j, got in enumerate(together[i]):
            np.testing.assert_array_equal(got, alone[i][j % 3])


def _edited_model_copy(default_artifact, tmp_path, **facts):
    for f in default_artifact.iterdir():
        if f.is_file() and f.name != "manifest.json":
            (tmp_path / f.name).symlink_to(f)
    m = json.loads((default_artifact / "manifest.json").read_text())
    m["model"].update(facts)
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    return tmp_path


@pytest.mark.parametrize(
    ("facts", "message"),
    [
        ({"intermediate_size": 6144}, r"tensor 'layers.0.gate_up.codes' holds 884736 values; .* need 3538944"),
        ({"head_dim": 128}, r"tensor 'layers.0.qkv.codes' holds 276480 values; .* need 552960"),
        ({"hidden_size": 640}, r"holds .* values; the manifest's model facts \(hidden_size 640"),
        ({"vocab_size": 50000}, r"tensor 'embed.codes' holds 28311552 values"),
        ({"num_kv_heads": 0}, r"num_heads a multiple of num_kv_heads >= 1"),
    ],
)
def test_a_manifest_that_disagrees_with_its_weights_is_refused(default_artifact, tmp_path, facts, message):
    """Before: intermediate_size 6144 killed `trtpipe generate` with SIGSEGV, head_dim 128 ran and
    printed tokens computed from the wrong memory. Each count is N x K of the real weights
    (SmolLM2: gate_up 2 x 1536 x 576 / 2 bytes, qkv 960 x 576 / 2, embed 49152 x 576)."""
    from trtpipe.runtime.llm import LLM

    art = _edited_model_copy(default_artifact, tmp_path, **facts)
    with pytest.raises(ArtifactError, match=message):
        LLM(art, engine="native")
