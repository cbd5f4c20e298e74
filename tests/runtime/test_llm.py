"""The runtime end to end on the real model: no torch, batching invariance, streaming text,
cancellation, bad input, artifact fingerprint checks, and the `trtpipe generate` CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from conftest import FRANCE_PROMPT

pytestmark = pytest.mark.slow


def test_runtime_runs_without_torch(int4_artifact):
    """Import the runtime where `import torch` fails, and generate."""
    code = textwrap.dedent(f"""
        import sys
        class _Block:
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch.") or name == "transformers":
                    raise ImportError("torch is blocked in this test")
        sys.meta_path.insert(0, _Block())
        from trtpipe.runtime.llm import LLM
        from trtpipe.runtime.sample.params import SamplingParams
        llm = LLM({str(int4_artifact)!r})
        out = llm.generate([{FRANCE_PROMPT!r}], SamplingParams(max_new_tokens=16), chat=True)[0]
        assert "torch" not in sys.modules
        print(out.text)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout


def test_batched_greedy_equals_each_request_alone(int4_llm):
    """16 requests of mixed lengths arriving at different steps == each run alone."""
    from trtpipe.runtime.sample.params import SamplingParams

    llm = int4_llm
    base = ("Tell me about {}.", "Write a short poem about {}.", "Why is {} important?", "Describe {} in detail.")
    topics = ["rivers", "the moon", "bread", "music", "trains", "cats", "winter", "copper"]
    prompts = [base[i % 4].format(topics[i % 8]) + " " * (i % 3) for i in range(16)]
    params = [SamplingParams(max_new_tokens=8 + (i * 5) % 17) for i in range(16)]
    alone = [llm.generate([p], sp, chat=True)[0].output_token_ids for p, sp in zip(prompts, params)]
    # staggered arrivals: 4 now, then 2 more every step
    pending = list(range(16))
    rid_of = {}
    for i in pending[:4]:
        rid_of[llm.add_request(prompts[i], params[i], chat=True)] = i
    pending = pending[4:]
    outs = {}
    max_batch = 0
    while llm.has_unfinished() or pending:
        for i in pending[:2]:
            rid_of[llm.add_request(prompts[i], params[i], chat=True)] = i
        pending = pending[2:]
        max_batch = max(max_batch, llm.scheduler.num_running)
        for o in llm.step():
            outs[rid_of[o.request_id]] = o.output_token_ids
    assert max_batch > 1
    assert [outs[i] for i in range(16)] == alone
    assert llm.block_pool.num_used == 0


def test_decode_through_prefill_graph_equals_decode_graph(int4_artifact, tmp_path):
    """engine.ort_sessions: one session (decode steps as 1-token prefill chunks) and two sessions
    (the decode graph) give the same greedy tokens for a batch of three."""
    from trtpipe.runtime.llm import LLM
    from trtpipe.runtime.sample.params import SamplingParams

    manifest = json.loads((int4_artifact / "manifest.json").read_text())
    mode = manifest["runtime_options"]["ort_decode_graph"]
    assert mode == "prefill"  # int4 in both phases: auto -> one session
    for f in int4_artifact.iterdir():
        if f.name != "manifest.json":
            (tmp_path / f.name).symlink_to(f)
    manifest["runtime_options"]["ort_decode_graph"] = "decode"
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    one, two = LLM(int4_artifact, engine="ort"), LLM(tmp_path, engine="ort")
    assert list(one.engine.sessions) == ["prefill"] and list(two.engine.sessions) == ["prefill", "decode"]
    prompts = ["The capital of France is", "def fib(n):", "Once upon a time, in a land far away,"]
    sp = SamplingParams(max_new_tokens=24, ignore_eos=True)
    got = [[o.output_token_ids for o in llm.generate(prompts, sp)] for llm in (one, two)]
    assert got[0] == got[1]
    assert one.block_pool.num_used == 0 and two.block_pool.num_used == 0


@pytest.mark.parametrize(
    "text",
    [
        "北京是中国的首都，长城很长。",
        "東京は日本の首都です。ありがとう！",
        "Emoji: 🎉🚀👩‍💻 done",
        "Москва — столица России.",
    ],
)
def test_streamed_pieces_concatenate_to_full_decode_real_tokenizer(int4_llm, text):
    from trtpipe.runtime.artifact.detokenizer import IncrementalDetokenizer

    tok = int4_llm.tokenizer
    ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok.backend, [1, 2, 3])
    pieces = [detok.add(i) for i in ids] + [detok.flush()]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == tok.decode(ids) == text


def test_stream_yields_the_same_text_as_generate(int4_llm):
    from trtpipe.runtime.sample.params import SamplingParams

    sp = SamplingParams(max_new_tokens=24)
    pieces = list(int4_llm.stream(FRANCE_PROMPT, sp, chat=True))
    full = int4_llm.generate([FRANCE_PROMPT], sp, chat=True)[0].text
    assert len(pieces) > 1 and "".join(pieces) == full and "Paris" in full


def test_cancel_frees_blocks_and_other_requests_finish(int4_llm):
    from trtpipe.runtime.sample.params import SamplingParams

    llm = int4_llm
    a = llm.add_request("Count from one to one hundred.", SamplingParams(max_new_tokens=64), chat=True)
    b = llm.add_request(FRANCE_PROMPT, SamplingParams(max_new_tokens=16), chat=True)
    llm.step()
    llm.step()
    used_before = llm.block_pool.num_used
    assert llm.cancel(a)
    assert llm.block_pool.num_used < used_before
    outs = llm.run_until_done()
    assert [o.request_id for o in outs] == [b] and "Paris" in outs[0].text
    assert llm.block_pool.num_used == 0
    assert not llm.cancel(a)


def test_stop_string_and_sampling_seed(int4_llm):
    from trtpipe.runtime.sample.params import SamplingParams

    out = int4_llm.generate([FRANCE_PROMPT], SamplingParams(max_new_tokens=32, stop=("Paris",)), chat=True)[0]
    assert out.finish_reason == "stop" and "Paris" not in out.text and out.text.startswith("The capital")
    # streaming never leaks a stop string, even one split across tokens ("Par" + "is")
    pieces = list(int4_llm.stream(FRANCE_PROMPT, SamplingParams(max_new_tokens=32, stop=("Paris",)), chat=True))
    assert "".join(pieces) == out.text
    pieces = list(int4_llm.stream(FRANCE_PROMPT, SamplingParams(max_new_tokens=32, stop=("is Par",)), chat=True))
    assert "".join(pieces) == "The capital of France " and int4_llm.last_output.finish_reason == "stop"
    # a stop string that is not followed by EOS must end generation itself
    out = int4_llm.generate(["Count: 1, 2, 3,"], SamplingParams(max_new_tokens=30, stop=("7",)))[0]
    assert out.finish_reason == "stop" and len(out.output_token_ids) < 30
    assert "7" not in out.text and out.text.rstrip().endswith("6,")
    sp = SamplingParams(max_new_tokens=16, temperature=0.9, top_p=0.9, top_k=40, seed=7)
    a = int4_llm.generate(["Tell me a story."], sp, chat=True)[0].output_token_ids
    b = int4_llm.generate(["Tell me a story."], sp, chat=True)[0].output_token_ids
    assert a == b


@pytest.mark.parametrize(
    "prompt,kw,match",
    [
        ("", {}, "prompt"),
        (b"\xff\xfe bad", {}, "UTF-8"),
        ("x " * 1100, {}, "max_seq_len"),
        ("hi", {"max_new_tokens": 0}, "max_new_tokens"),
        ("hi", {"temperature": -1.0}, "temperature"),
        ("hi", {"top_p": 0.0}, "top_p"),
        ("hi", {"top_p": 1.5}, "top_p"),
    ],
)
def test_bad_requests_are_refused_without_disturbing_others(int4_llm, prompt, kw, match):
    from trtpipe.runtime.errors import RequestError
    from trtpipe.runtime.sample.params import SamplingParams

    llm = int4_llm
    good = llm.add_request(FRANCE_PROMPT, SamplingParams(max_new_tokens=12), chat=True)
    with pytest.raises(RequestError, match=match):
        llm.add_request(prompt, SamplingParams(**kw))
    outs = llm.run_until_done()
    assert [o.request_id for o in outs] == [good] and "Paris" in outs[0].text


def _copy_artifact(src, tmp_path):
    dst = tmp_path / "art"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("weights.data"))
    os.symlink(src / "weights.data", dst / "weights.data")
    return dst


def test_artifact_fingerprint_and_corruption_are_refused(int4_artifact, tmp_path):
    from trtpipe.runtime.artifact.manifest import load_manifest
    from trtpipe.runtime.errors import ArtifactError

    with pytest.raises(ArtifactError, match="trtpipe build"):
        load_manifest(tmp_path / "nowhere")
    art = _copy_artifact(int4_artifact, tmp_path)
    m = json.loads((art / "manifest.json").read_text())
    m["op_abi_hash"] = "0" * 64
    (art / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match="op schema ABI hash.*rebuild"):
        load_manifest(art)
    m["op_abi_hash"] = json.loads((int4_artifact / "manifest.json").read_text())["op_abi_hash"]
    m["backend"]["version"] = "0.0.1"
    (art / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match="onnxruntime 0.0.1"):
        load_manifest(art)
    shutil.copy(int4_artifact / "manifest.json", art / "manifest.json")
    with open(art / "decode.onnx", "ab") as f:
        f.write(b"\0")
    with pytest.raises(ArtifactError, match="decode.onnx is corrupted"):
        load_manifest(art)
    shutil.copy(int4_artifact / "decode.onnx", art / "decode.onnx")
    (art / "tokenizer.json").unlink()
    with pytest.raises(ArtifactError, match="tokenizer.json is missing"):
        load_manifest(art)


def test_cli_generate_streams_the_answer(int4_artifact):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "trtpipe.pipeline.cli.main",
            "generate",
            str(int4_artifact),
            FRANCE_PROMPT,
            "--chat",
            "--max-new-tokens",
            "16",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "The capital of France is Paris."
    assert "TTFT" in r.stderr and "TPOT" in r.stderr


def test_cli_generate_bad_input_exit_2(int4_artifact, tmp_path):
    for args in (["generate", str(tmp_path), "hi"], ["generate", str(int4_artifact), "hi", "--top-p", "2"]):
        r = subprocess.run(
            [sys.executable, "-m", "trtpipe.pipeline.cli.main", *args], capture_output=True, text=True, timeout=300
        )
        assert r.returncode == 2, r.stderr
        assert "error:" in r.stderr and "fix" in r.stderr.lower()


def test_prompt_length_boundary_is_the_schedulers(int4_llm):
    """LLM.add_request applies the scheduler's rule: max_seq_len - 1 prompt tokens run (one token
    out), max_seq_len tokens are refused with the same message."""
    from trtpipe.runtime.errors import RequestError
    from trtpipe.runtime.sample.params import SamplingParams
    from trtpipe.runtime.sched.request import prompt_length_error

    llm = int4_llm
    max_len = llm.manifest.limits.max_seq_len
    ids = [llm.tokenizer.encode("hello", add_special_tokens=False)[0]] * max_len
    with pytest.raises(RequestError) as e:
        llm.add_request(ids, SamplingParams(max_new_tokens=4))
    assert str(e.value) == prompt_length_error(max_len, max_len)
    rid = llm.add_request(ids[:-1], SamplingParams(max_new_tokens=4, ignore_eos=True))
    (out,) = llm.run_until_done()
    assert out.request_id == rid and out.finish_reason == "length" and len(out.output_token_ids) == 1
    assert llm.block_pool.num_used == 0
