"""The artifact store (local folder and fsspec memory://) and ``trtpipe pull``.

Store tests use small synthetic folders (the store only needs manifest.json to be present);
pull tests use the real default artifact, because pull runs the runtime's manifest checks.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import pytest

pytest.importorskip("fsspec")

from trtpipe.pipeline.farm.store import LATEST_NAME, RECORD_NAME, ArtifactStore, StoreError  # noqa: E402
from trtpipe.runtime.artifact.manifest import sha256_file  # noqa: E402

CPU_RECIPE = "smollm2-135m-cpu"


def _fake_artifact(d: Path, payload: bytes = b"weights") -> Path:
    d.mkdir(parents=True)
    (d / "manifest.json").write_text('{"fake": true}')
    (d / "weights.data").write_bytes(payload)
    (d / "validate").mkdir()
    (d / "validate" / "report.json").write_text("{}")
    (d / ".weights.data.tmp-123").write_bytes(b"left by a killed write")  # hidden: never published
    return d


@pytest.fixture(params=["local", "memory"])
def store_url(request, tmp_path) -> str:
    if request.param == "local":
        yield str(tmp_path / "store")
        return
    url = f"memory://farm-test-{uuid.uuid4().hex[:8]}"
    yield url
    ArtifactStore(url).fs.rm(ArtifactStore(url).root, recursive=True)


def test_publish_layout_record_and_latest(store_url, tmp_path):
    art = _fake_artifact(tmp_path / "a")
    store = ArtifactStore(store_url)
    assert store.lookup("r", "cpu", "h1") is None and store.latest("r", "cpu") is None
    stored, new = store.publish(art, recipe="r", target="cpu", build_hash="h1", node="n1", validate="PASS")
    assert new
    cell = store.cell_path("r", "cpu", "h1")
    files = sorted(store.fs.find(cell))
    assert [f[len(cell) + 1 :] for f in files] == ["manifest.json", RECORD_NAME, "validate/report.json", "weights.data"]
    assert stored.files == {
        "manifest.json": sha256_file(art / "manifest.json"),
        "validate/report.json": sha256_file(art / "validate" / "report.json"),
        "weights.data": sha256_file(art / "weights.data"),
    }
    assert (stored.node, stored.validate) == ("n1", "PASS")
    assert store.fs.cat_file(f"{store.root}/r/cpu/{LATEST_NAME}") == b"h1\n"
    assert store.latest("r", "cpu") == stored
    assert store.published() == [("r", "cpu")]
    # no temp names remain anywhere
    assert not [p for p in store.fs.find(store.root) if "/." in p]


def test_same_build_hash_is_not_uploaded_again(store_url, tmp_path, monkeypatch):
    store = ArtifactStore(store_url)
    first, _ = store.publish(_fake_artifact(tmp_path / "a"), recipe="r", target="cpu", build_hash="h1")
    monkeypatch.setattr(store.fs, "put_file", lambda *a, **k: pytest.fail("uploaded a build already in the store"))
    again, new = store.publish(_fake_artifact(tmp_path / "b", b"other"), recipe="r", target="cpu", build_hash="h1")
    assert not new and again == first


def test_latest_follows_the_newest_publish(store_url, tmp_path):
    store = ArtifactStore(store_url)
    store.publish(_fake_artifact(tmp_path / "a"), recipe="r", target="cpu", build_hash="h1")
    store.publish(_fake_artifact(tmp_path / "b", b"v2"), recipe="r", target="cpu", build_hash="h2")
    assert store.latest("r", "cpu").build_hash == "h2"
    assert store.lookup("r", "cpu", "h1").build_hash == "h1"  # older builds stay addressable


def test_interrupted_upload_is_invisible_and_cleaned_up(store_url, tmp_path, monkeypatch):
    store = ArtifactStore(store_url)
    art = _fake_artifact(tmp_path / "a")
    real_put = store.fs.put_file
    calls = []

    def dying_put(src, dst, **kw):
        calls.append(dst)
        if len(calls) == 2:
            raise KeyboardInterrupt  # Ctrl-C / node death in the middle of the upload
        return real_put(src, dst, **kw)

    monkeypatch.setattr(store.fs, "put_file", dying_put)
    with pytest.raises(KeyboardInterrupt):
        store.publish(art, recipe="r", target="cpu", build_hash="h1")
    assert store.lookup("r", "cpu", "h1") is None and store.latest("r", "cpu") is None
    assert not store.fs.exists(store.cell_path("r", "cpu", "h1"))
    assert not [p for p in store.fs.find(store.root) if "/.tmp-" in p]  # the partial upload is removed
    monkeypatch.setattr(store.fs, "put_file", real_put)
    _, new = store.publish(art, recipe="r", target="cpu", build_hash="h1")
    assert new


def test_a_cell_without_its_record_does_not_count(store_url, tmp_path):
    """An object-store upload killed after the move but before the record: absent, replaced."""
    store = ArtifactStore(store_url)
    cell = store.cell_path("r", "cpu", "h1")
    store.fs.makedirs(cell, exist_ok=True)
    store.fs.pipe_file(f"{cell}/weights.data", b"half")
    assert store.lookup("r", "cpu", "h1") is None
    stored, new = store.publish(_fake_artifact(tmp_path / "a"), recipe="r", target="cpu", build_hash="h1")
    assert new and store.fs.cat_file(f"{cell}/weights.data") == b"weights"


def test_publish_refuses_a_folder_without_manifest(tmp_path):
    d = tmp_path / "a"
    d.mkdir()
    (d / "weights.data").write_bytes(b"x")
    with pytest.raises(StoreError, match="no manifest.json"):
        ArtifactStore(tmp_path / "store").publish(d, recipe="r", target="cpu", build_hash="h")


# ----------------------------------------------------------------------------------------------
# pull: the real artifact, the runtime's checks
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def published(cpu_artifact_root, tmp_path_factory):
    from trtpipe.runtime.artifact.manifest import load_manifest

    art = cpu_artifact_root / CPU_RECIPE / "cpu"
    m = load_manifest(art, verify_hashes=False)
    url = str(tmp_path_factory.mktemp("pull") / "store")
    ArtifactStore(url).publish(art, recipe=CPU_RECIPE, target="cpu", build_hash=m.build_info["build_hash"])
    return url, m


@pytest.mark.slow
def test_pull_verifies_and_installs(published, tmp_path):
    from trtpipe.pipeline.farm.pull import pull

    url, m = published
    dest = tmp_path / "dev" / CPU_RECIPE / "cpu"
    res = pull(url, CPU_RECIPE, "cpu", dest, log=lambda s: None)
    assert res.artifact_dir == dest and res.stored.build_hash == m.build_info["build_hash"]
    assert json.loads((dest / "manifest.json").read_text())["files"] == m.files
    assert [p.name for p in dest.parent.iterdir()] == ["cpu"]  # no temp folder left


@pytest.mark.slow
def test_pull_refuses_a_corrupted_store_copy_and_keeps_the_old_artifact(published, tmp_path):
    from trtpipe.pipeline.farm.pull import pull

    url, m = published
    store_copy = tmp_path / "store"
    shutil.copytree(url, store_copy)
    cell = Path(ArtifactStore(store_copy).cell_path(CPU_RECIPE, "cpu", m.build_info["build_hash"]))
    with open(cell / "tokenizer.json", "r+b") as f:
        f.write(b"X")
    dest = tmp_path / "dev"
    dest.mkdir()
    (dest / "previous").write_text("still here")
    with pytest.raises(StoreError, match=r"tokenizer.json: sha256 .* differs from the store record"):
        pull(str(store_copy), CPU_RECIPE, "cpu", dest, log=lambda s: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dev", "store"]
    assert (dest / "previous").read_text() == "still here"


@pytest.mark.slow
def test_pull_refuses_an_artifact_for_another_runtime(published, tmp_path):
    """A manifest whose op-ABI hash differs from this runtime's: the runtime's own refusal."""
    from trtpipe.pipeline.farm.pull import pull
    from trtpipe.runtime.errors import ArtifactError

    url, m = published
    art = tmp_path / "art"
    shutil.copytree(m.root, art, ignore=shutil.ignore_patterns("validate"))
    doc = json.loads((art / "manifest.json").read_text())
    doc["op_abi_hash"] = "0" * 64
    (art / "manifest.json").write_text(json.dumps(doc))
    store = str(tmp_path / "store")
    ArtifactStore(store).publish(art, recipe=CPU_RECIPE, target="cpu", build_hash=m.build_info["build_hash"])
    with pytest.raises(ArtifactError, match=r"does not fit this device: .*op schema ABI hash 000000000000"):
        pull(store, CPU_RECIPE, "cpu", tmp_path / "dest", log=lambda s: None)
    assert not (tmp_path / "dest").exists()


@pytest.mark.slow
def test_pull_refuses_an_artifact_filed_under_another_target(published, tmp_path):
    from trtpipe.pipeline.farm.pull import pull

    url, m = published
    store = str(tmp_path / "store")
    ArtifactStore(store).publish(m.root, recipe=CPU_RECIPE, target="orin", build_hash=m.build_info["build_hash"])
    with pytest.raises(StoreError, match=r"the manifest says recipe 'smollm2-135m-cpu', target 'cpu'.*'orin'"):
        pull(store, CPU_RECIPE, "orin", tmp_path / "dest", log=lambda s: None)


def test_pull_of_nothing_names_what_the_store_has(tmp_path):
    from trtpipe.pipeline.farm.pull import pull

    store = ArtifactStore(tmp_path / "store")
    store.publish(_fake_artifact(tmp_path / "a"), recipe="r", target="cpu", build_hash="h1")
    with pytest.raises(StoreError, match=r"no published smollm2-135m-cpu/a100 \(it has: r/cpu\)"):
        pull(str(tmp_path / "store"), CPU_RECIPE, "a100", tmp_path / "dest", log=lambda s: None)


@pytest.mark.parametrize("kind", ["local", "memory"])
def test_pull_from_a_store_that_does_not_exist_says_so(tmp_path, kind):
    """A wrong --store path is not an empty store: the message says the folder does not exist and
    gives both fixes; nothing is created at the store or the destination."""
    from trtpipe.pipeline.farm.pull import pull

    url = str(tmp_path / "no-such-store") if kind == "local" else f"memory://no-such-store-{uuid.uuid4().hex[:8]}"
    with pytest.raises(StoreError) as e:
        pull(url, CPU_RECIPE, "cpu", tmp_path / "dest", log=lambda s: None)
    assert str(e.value) == (
        f"store {url} does not exist (no such folder). Fix: check the path (--store or $TRTPIPE_STORE), "
        f"or publish to it first: `trtpipe farm build {CPU_RECIPE} --store {url}`."
    )
    assert not (tmp_path / "dest").exists() and not (tmp_path / "no-such-store").exists()
