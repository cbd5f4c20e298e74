"""How the deploy-side commands (info, generate, chat, serve, validate) find an artifact, and what
they say when the folder given is not one: the built folder below it, passed the way that command
takes it. Fast: only the presence of manifest.json matters before the error, so the artifacts
here are empty folders with an empty manifest.json."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from trtpipe.pipeline.cli.main import main
from trtpipe.runtime.errors import ArtifactError

RECIPE = "smollm2-135m-cpu"


def _built(root: Path, *targets: str) -> Path:
    """``root/<recipe>/<target>/manifest.json`` for each target; returns the recipe folder."""
    for t in targets:
        (root / RECIPE / t).mkdir(parents=True)
        (root / RECIPE / t / "manifest.json").write_text("{}")
    return root / RECIPE


def _run(*args) -> tuple[int, str]:
    res = CliRunner().invoke(main, [str(a) for a in args])
    return res.exit_code, " ".join(res.output.split())  # rich/click may wrap long lines


@pytest.mark.parametrize(
    "argv, fix",
    [
        (["info", "{d}"], "`trtpipe info {d}/cpu`"),
        (["generate", "{d}", "hi"], "`trtpipe generate {d}/cpu ...`"),
        (["chat", "{d}"], "`trtpipe chat {d}/cpu`"),
        (["serve", "{d}"], "`trtpipe serve {d}/cpu`"),
        (["validate", RECIPE, "--artifact", "{d}"], f"`trtpipe validate {RECIPE} --artifact {{d}}/cpu`"),
    ],
)
def test_recipe_folder_names_the_target_folder_to_pass(tmp_path, argv, fix):
    d = _built(tmp_path, "cpu").as_posix()
    code, out = _run(*(a.format(d=d) for a in argv))
    assert code == 2
    assert f"{d} is not a trtpipe artifact (no manifest.json); it holds built targets: cpu." in out
    assert "Fix: " + fix.format(d=d) + "." in out


def test_artifacts_root_lists_recipe_target_folders(tmp_path):
    _built(tmp_path, "cpu", "orin")
    code, out = _run("info", tmp_path)
    assert code == 2
    assert f"it holds built artifacts (<recipe>/<target>): {RECIPE}/cpu, {RECIPE}/orin." in out
    assert f"Fix: `trtpipe info {tmp_path.as_posix()}/{RECIPE}/cpu` (or another of them)." in out


def test_load_manifest_outside_the_cli_says_pass_the_folder(tmp_path):
    from trtpipe.runtime.artifact.manifest import load_manifest

    d = _built(tmp_path, "cpu")
    with pytest.raises(ArtifactError, match=f"holds built targets: cpu. Fix: pass {d}/cpu instead."):
        load_manifest(d)
    with pytest.raises(ArtifactError, match=f"{tmp_path}/nowhere does not exist. Fix: check the path"):
        load_manifest(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ArtifactError, match=r"not a trtpipe artifact \(no manifest.json\). Fix: run `trtpipe build"):
        load_manifest(tmp_path / "empty")


@pytest.mark.parametrize(
    "argv, fix",
    [
        (["info", RECIPE], "`trtpipe info DIR`"),
        (["generate", RECIPE, "hi"], "`trtpipe generate DIR ...`"),
        (["chat", RECIPE], "`trtpipe chat DIR`"),
        (["serve", RECIPE], "`trtpipe serve DIR`"),
        (["validate", RECIPE], f"`trtpipe validate {RECIPE} --artifact DIR`"),
    ],
)
def test_missing_artifact_gives_every_command_the_same_three_fixes(tmp_path, argv, fix):
    code, out = _run(*argv, "--artifacts", tmp_path)
    assert code == 2
    assert f"no artifact for recipe '{RECIPE}' in {tmp_path}/{RECIPE}/cpu: the root holds no artifacts" in out
    assert (
        f"Fix: run `trtpipe build {RECIPE} --artifacts {tmp_path.resolve()}` first, or point --artifacts / "
        "$TRTPIPE_ARTIFACTS at the folder it was "
        f"built in, or pass the artifact folder: {fix}." in out
    )


def test_missing_artifact_says_whether_the_root_exists_and_what_it_holds(tmp_path):
    """A missing root read like an empty one (new-user trial); a root with other builds lists them."""
    code, out = _run("info", RECIPE, "--artifacts", tmp_path / "nowhere")
    assert code == 2
    assert f"in {tmp_path}/nowhere/{RECIPE}/cpu: the artifacts root {tmp_path}/nowhere does not exist" in out
    for name in ("other/cpu", "other/orin", f"{RECIPE}/a100"):
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / "manifest.json").write_text("{}")
    code, out = _run("info", RECIPE, "--artifacts", tmp_path)
    assert code == 2
    assert f"cpu: the root holds other/cpu, other/orin, {RECIPE}/a100 (artifacts root:" in out


@pytest.mark.parametrize("given", ["artifact", "recipe folder"])
@pytest.mark.parametrize("command", [["info", RECIPE], ["generate", RECIPE, "hi"], ["validate", RECIPE]])
def test_artifacts_root_that_is_an_artifact_names_its_root_not_a_nested_build(tmp_path, given, command):
    """``--artifacts`` given the folder ``build`` printed (or the recipe folder above it): the fix
    is the real root (or the artifact itself), never a build nested inside the artifact."""
    d = _built(tmp_path, "cpu")
    wrong = d / "cpu" if given == "artifact" else d
    code, out = _run(*command, "--artifacts", wrong)
    assert code == 2
    assert f"the artifacts root {wrong.resolve()} is itself an artifact folder" in out
    assert f"Fix: pass its root, --artifacts {tmp_path.resolve()}, or the artifact folder itself: " in out
    assert f"{(d / 'cpu').resolve().as_posix()}" in out.split("artifact folder itself: ")[1]
    assert "trtpipe build" not in out


@pytest.mark.parametrize("below", [False, True], ids=["the-root", "a-folder-above"])
@pytest.mark.parametrize(
    "command", [["build", RECIPE], ["info", RECIPE], ["generate", RECIPE, "hi"], ["serve", RECIPE]]
)
def test_artifacts_root_that_is_a_file_is_a_usage_error_naming_it(tmp_path, command, below):
    """--artifacts naming a regular file: build ended in a NotADirectoryError traceback (exit 1);
    info/generate/serve said the root "does not exist" and suggested that same build. Now every
    command exits 2 naming the file and the fix, and nothing is written."""
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    root = afile / "sub" if below else afile
    code, out = _run(*command, "--artifacts", root)
    assert code == 2, out
    what = f"has a file above it, {afile}" if below else "is a file"
    assert f"artifacts root {root} {what}; expected a folder" in out
    assert "Fix: pass a folder, e.g. --artifacts artifacts, or move the file away." in out
    assert "does not exist" not in out and "Traceback" not in out
    assert afile.read_text() == "not a folder" and sorted(tmp_path.iterdir()) == [afile]
