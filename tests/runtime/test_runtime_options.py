"""RuntimeOptions: the manifest's runtime options typed at load, no silent defaults."""

import json
import re

import pytest

from trtpipe.runtime.artifact.manifest import MANIFEST_NAME, load_manifest
from trtpipe.runtime.artifact.runtime_options import SharedInitializer, parse_runtime_options
from trtpipe.runtime.errors import ArtifactError

ORT = {
    "shared_data_file": "weights.data",
    "shared_initializers": {"w": ["float32", [2, 3], 64, 24]},
    "intra_op_num_threads": None,
    "ort_decode_graph": "prefill",
}
TRT = {
    "layout": "dual_profile",
    "kv_in_place": True,
    "profiles": {"decode": {"profile_index": 1}},
    "graph_sha256": {"prefill": "ab"},
}
FIX = "trtpipe build r.yaml --force"


def parse(backend, options):
    return parse_runtime_options({"name": backend}, options, where="a/manifest.json", rebuild=FIX)


def test_ort_options_are_typed():
    o = parse("ort", ORT)
    assert (o.backend, o.shared_data_file, o.intra_op_num_threads, o.ort_decode_graph) == (
        "ort",
        "weights.data",
        None,
        "prefill",
    )
    assert o.shared_initializers == {"w": SharedInitializer("float32", (2, 3), 64, 24)}
    assert (o.layout, o.kv_in_place, o.profiles) == (None, None, None)  # trt-only: None, explicitly


def test_trt_options_are_typed():
    o = parse("trt", TRT)
    assert (o.layout, o.kv_in_place, o.profiles["decode"]["profile_index"]) == ("dual_profile", True, 1)
    assert (o.shared_data_file, o.ort_decode_graph, o.intra_op_num_threads) == (None, None, None)


@pytest.mark.parametrize(
    "backend, options, key",
    [
        ("ort", ORT, "ort_decode_graph"),
        ("ort", ORT, "intra_op_num_threads"),
        ("ort", ORT, "shared_data_file"),
        ("trt", TRT, "kv_in_place"),
        ("trt", TRT, "layout"),
        ("trt", TRT, "profiles"),
    ],
)
def test_a_missing_option_names_it_and_the_rebuild_command(backend, options, key):
    opts = {k: v for k, v in options.items() if k != key}
    with pytest.raises(ArtifactError, match=rf"a/manifest.json: runtime_options lacks {key} .*Fix: `{FIX}`"):
        parse(backend, opts)


@pytest.mark.parametrize(
    "backend, key, value, expected",
    [
        ("ort", "ort_decode_graph", "both", "'prefill' or 'decode'"),
        ("ort", "intra_op_num_threads", 0, "an int >= 1 or null"),
        ("ort", "shared_initializers", {"w": ["float32"]}, "an object"),
        ("trt", "layout", "fused", "'split' or 'dual_profile'"),
        ("trt", "kv_in_place", "yes", "true or false"),
    ],
)
def test_a_bad_option_value_names_field_value_and_expectation(backend, key, value, expected):
    opts = {**(ORT if backend == "ort" else TRT), key: value}
    with pytest.raises(ArtifactError, match=re.escape(f"runtime_options.{key} = {value!r}: expected {expected}")):
        parse(backend, opts)


@pytest.mark.parametrize("backend", [{}, {"name": "vllm"}])
def test_the_backend_name_has_no_default(backend):
    with pytest.raises(ArtifactError, match=r"backend.name = .*expected one of ort, trt.*Fix"):
        parse_runtime_options(backend, ORT, where="m", rebuild=FIX)


def _copy_artifact(src, dst, edit):
    manifest = json.loads((src / MANIFEST_NAME).read_text())
    for f in src.iterdir():
        if f.name != MANIFEST_NAME:
            (dst / f.name).symlink_to(f)
    edit(manifest)
    (dst / MANIFEST_NAME).write_text(json.dumps(manifest))
    return dst


def test_the_built_artifact_loads_typed_options(default_artifact):
    m = load_manifest(default_artifact, verify_hashes=False)
    assert m.options.backend == "ort" and m.options.ort_decode_graph in ("prefill", "decode")
    assert m.options.shared_initializers and m.options.shared_data_file == m.runtime_options["shared_data_file"]


def test_load_manifest_refuses_a_manifest_without_ort_decode_graph(default_artifact, tmp_path):
    art = _copy_artifact(default_artifact, tmp_path, lambda m: m["runtime_options"].pop("ort_decode_graph"))
    with pytest.raises(ArtifactError, match=r"runtime_options lacks ort_decode_graph .*Fix: `trtpipe build "):
        load_manifest(art, verify_hashes=False)


NATIVE = {"isa": "avx2", "library": "tp.so", "weights_file": "native.bin", "tensors": {}}


@pytest.mark.parametrize(
    ("levels", "prefill", "decode"),
    [
        ({"prefill": 2, "decode": 1}, (2, 2, 2), (1, 1, 1)),
        ({"prefill": {"attention": 2, "mlp": 1, "head": 1}, "decode": 2}, (2, 1, 1), (2, 2, 2)),
    ],
)
def test_native_activation_levels_are_one_level_or_one_per_site(levels, prefill, decode):
    from trtpipe.runtime.artifact.runtime_options import ActivationLevels

    got = parse("ort", {**ORT, "native": {**NATIVE, "activation_levels": levels}}).native.activation_levels
    assert got == {"prefill": ActivationLevels(*prefill), "decode": ActivationLevels(*decode)}
    assert {ph: lv.to_json() for ph, lv in got.items()} == levels  # the manifest form round-trips
    assert str(got["prefill"]) == ("2" if prefill == (2, 2, 2) else "attention 2 mlp 1 head 1")


@pytest.mark.parametrize(
    "levels",
    [
        {"prefill": 3, "decode": 2},
        {"prefill": True, "decode": 2},
        {"prefill": {"attention": 2, "mlp": 1}, "decode": 2},
        {"prefill": {"attention": 2, "mlp": 1, "head": 0}, "decode": 2},
        {"prefill": 2},
        {"prefill": 2, "decode": 2, "mixed": 2},
        [2, 2],
    ],
)
def test_a_bad_activation_level_is_refused_with_the_forms(levels):
    with pytest.raises(ArtifactError, match=r"runtime_options.native.activation_levels = .*expected \{prefill: L"):
        parse("ort", {**ORT, "native": {**NATIVE, "activation_levels": levels}})


def test_native_activation_form_is_read_and_defaults_to_two_int8_levels():
    """``activation_form`` (how the library holds levels 2, plugins/cpu/isa.py): absent in
    manifests written before it (two int8 levels then), one of the forms, else refused."""
    native = {**NATIVE, "activation_levels": {"prefill": 2, "decode": 2}}
    assert parse("ort", {**ORT, "native": native}).native.activation_form == "int8x2"
    assert parse("ort", {**ORT, "native": {**native, "activation_form": "int16"}}).native.activation_form == "int16"
    with pytest.raises(ArtifactError, match=r"native.activation_form = 'int4': expected 'int8x2' or 'int16'"):
        parse("ort", {**ORT, "native": {**native, "activation_form": "int4"}})
