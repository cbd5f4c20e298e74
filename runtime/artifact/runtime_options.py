"""``RuntimeOptions``: the manifest's ``runtime_options``, typed and checked once when it loads.

The build writes these per backend (``pipeline/stages/cpu.py`` for ``ort``, ``pipeline/stages/tensorrt/gpu.py``
for ``trt``); the engines read them from this record, never from the raw dict, so there is no
silent default: an option the backend needs and the manifest lacks is an :class:`ArtifactError`
naming it and the command that rebuilds the artifact. Options written only for the other
backend are ``None`` here, explicitly.

    backend  option                  type                       meaning
    ort      shared_data_file        str                        external data file of both graphs
    ort      shared_initializers     {name: SharedInitializer}  byte ranges in that file ({} = none)
    ort      intra_op_num_threads    int >= 1 | null            ORT threads (null: ORT's default)
    ort      ort_decode_graph        "prefill" | "decode"       graph that runs decode steps
    ort      native                  NativeOptions | null       the host CPU kernels' engine, built
                                                                beside the graphs (recipe
                                                                engine.cpu_backend; null: none)
    ort      ort_fused_steps         bool (absent: false)       the prefill graph takes a mixed
                                                                step's decodes (recipe
                                                                engine.ort_fused_steps); artifacts
                                                                built before it lack the key and
                                                                their graphs cannot: false
    trt      layout                  "split" | "dual_profile"   plans and contexts (engine_trt)
    trt      kv_in_place             bool                       plugins write the KV pool in place
    trt      profiles                {phase: {...}}             optimization profile per phase
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trtpipe.runtime.errors import ArtifactError

BACKENDS = ("ort", "trt")
ORT_DECODE_GRAPHS = ("prefill", "decode")
TRT_LAYOUTS = ("split", "dual_profile")
REQUIRED_OPTIONS: dict[str, tuple[str, ...]] = {
    "ort": ("shared_data_file", "shared_initializers", "intra_op_num_threads", "ort_decode_graph"),
    "trt": ("layout", "kv_in_place", "profiles"),
}


@dataclass(frozen=True)
class SharedInitializer:
    """One initializer shared by the ORT graphs: ``length_bytes`` at ``offset_bytes`` of the
    shared data file, viewed as ``dtype`` (numpy name) with ``shape``."""

    dtype: str
    shape: tuple[int, ...]
    offset_bytes: int
    length_bytes: int


ACTIVATION_SITES = ("attention", "mlp", "head")


@dataclass(frozen=True)
class ActivationLevels:
    """int8 levels (1 or 2) of one phase's GEMM activations per site in the native engine:
    ``attention`` (QKV and output projections), ``mlp`` (gate/up and down), ``head`` (LM head).
    In the manifest a phase is one int when every site has it, else ``{attention, mlp, head}``
    (the recipe's ``engine.cpu_activation_levels`` form)."""

    attention: int
    mlp: int
    head: int

    @classmethod
    def parse(cls, value: object) -> ActivationLevels | None:
        """From the manifest form; None when ``value`` is neither 1, 2 nor a full site mapping of them."""
        if isinstance(value, int) and not isinstance(value, bool) and value in (1, 2):
            return cls(value, value, value)
        if isinstance(value, Mapping) and set(value) == set(ACTIVATION_SITES):
            if all(isinstance(v, int) and not isinstance(v, bool) and v in (1, 2) for v in value.values()):
                return cls(*(int(value[k]) for k in ACTIVATION_SITES))
        return None

    @property
    def uniform(self) -> int | None:
        """The one level every site has, or None when they differ."""
        return self.attention if self.attention == self.mlp == self.head else None

    def to_json(self) -> int | dict[str, int]:
        return self.uniform or {k: getattr(self, k) for k in ACTIVATION_SITES}

    def __str__(self) -> str:
        return str(self.uniform) if self.uniform else " ".join(f"{k} {getattr(self, k)}" for k in ACTIVATION_SITES)


@dataclass(frozen=True)
class NativeOptions:
    """``runtime_options.native``: the native CPU engine's files and settings (written by
    ``pipeline/stages/native.py``): ``isa`` the kernels were compiled for (``plugins/cpu/isa.py``),
    ``library`` and ``weights_file`` (artifact files), ``tensors`` (``native.bin``'s table),
    ``activation_levels`` {phase: :class:`ActivationLevels`} (int8 levels of GEMM activations),
    ``activation_form``: how the library holds ``levels: 2`` ("int8x2" or "int16",
    ``plugins/cpu/isa.py`` ACT_FORM; "int8x2" where the manifest predates the field)."""

    isa: str
    library: str
    weights_file: str
    tensors: Mapping[str, Any]
    activation_levels: Mapping[str, ActivationLevels]
    activation_form: str = "int8x2"


@dataclass(frozen=True)
class RuntimeOptions:
    """Typed ``manifest.runtime_options`` (see the module docstring for each field)."""

    backend: str  # "ort" | "trt" (manifest ``backend.name``)
    # ort only (None for trt)
    shared_data_file: str | None
    shared_initializers: Mapping[str, SharedInitializer] | None
    intra_op_num_threads: int | None  # None also for ort: ORT picks its default
    ort_decode_graph: str | None
    ort_fused_steps: bool | None
    native: NativeOptions | None
    # trt only (None for ort)
    layout: str | None
    kv_in_place: bool | None
    profiles: Mapping[str, Mapping[str, Any]] | None


def parse_runtime_options(
    backend: Mapping[str, Any], options: Mapping[str, Any], *, where: str, rebuild: str
) -> RuntimeOptions:
    """Check ``backend`` (manifest ``backend``) and ``options`` (manifest ``runtime_options``).

    ``where`` names the manifest file and ``rebuild`` the command that rebuilds it, for messages.
    Raises :class:`ArtifactError` for a missing or unknown backend name, a missing option the
    backend needs, or an option of the wrong type or value.
    """
    name = backend.get("name")
    if name not in BACKENDS:
        raise ArtifactError(
            f"{where}: backend.name = {name!r}: expected one of {', '.join(BACKENDS)}. Fix: `{rebuild}`."
        )
    missing = [k for k in REQUIRED_OPTIONS[name] if k not in options]
    if missing:
        raise ArtifactError(
            f"{where}: runtime_options lacks {', '.join(missing)} (needed by the {name} backend; "
            f"the artifact was built by an older or damaged build). Fix: `{rebuild}`."
        )

    def bad(key: str, expected: str) -> ArtifactError:
        return ArtifactError(
            f"{where}: runtime_options.{key} = {options[key]!r}: expected {expected}. Fix: `{rebuild}`."
        )

    if name == "ort":
        return _parse_ort(options, bad, where, rebuild)
    layout, in_place, profiles = options["layout"], options["kv_in_place"], options["profiles"]
    if layout not in TRT_LAYOUTS:
        raise bad("layout", " or ".join(repr(v) for v in TRT_LAYOUTS))
    if not isinstance(in_place, bool):
        raise bad("kv_in_place", "true or false")
    if not isinstance(profiles, Mapping):
        raise bad("profiles", "an object {phase: {profile_index: ...}}")
    return RuntimeOptions(
        backend="trt",
        shared_data_file=None,
        shared_initializers=None,
        intra_op_num_threads=None,
        ort_decode_graph=None,
        ort_fused_steps=None,
        native=None,
        layout=layout,
        kv_in_place=in_place,
        profiles=profiles,
    )


def _parse_ort(options: Mapping[str, Any], bad: Any, where: str, rebuild: str) -> RuntimeOptions:
    data_file, shared = options["shared_data_file"], options["shared_initializers"]
    threads, decode_graph = options["intra_op_num_threads"], options["ort_decode_graph"]
    if not isinstance(data_file, str) or not data_file:
        raise bad("shared_data_file", "a file name in the artifact")
    if not isinstance(shared, Mapping):
        raise bad("shared_initializers", "an object {name: [dtype, shape, offset, length]}")
    try:
        initializers = {
            k: SharedInitializer(str(dt), tuple(int(d) for d in shape), int(offset), int(length))
            for k, (dt, shape, offset, length) in shared.items()
        }
    except (TypeError, ValueError):
        raise bad("shared_initializers", "an object {name: [dtype, shape, offset, length]}") from None
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise bad("intra_op_num_threads", "an int >= 1 or null")
    if decode_graph not in ORT_DECODE_GRAPHS:
        raise bad("ort_decode_graph", " or ".join(repr(v) for v in ORT_DECODE_GRAPHS))
    fused = options.get("ort_fused_steps", False)
    if not isinstance(fused, bool):
        raise bad("ort_fused_steps", "true or false")
    native = _parse_native(options.get("native"), where, rebuild)
    return RuntimeOptions(
        backend="ort",
        shared_data_file=data_file,
        shared_initializers=initializers,
        intra_op_num_threads=threads,
        ort_decode_graph=decode_graph,
        ort_fused_steps=fused,
        native=native,
        layout=None,
        kv_in_place=None,
        profiles=None,
    )


def _parse_native(nat: Any, where: str, rebuild: str) -> NativeOptions | None:
    """``runtime_options.native`` checked key by key (a message names the key and its value,
    never the whole section: its tensor table is large)."""
    if nat is None:
        return None
    from trtpipe.plugins.cpu.isa import ACT_FORMS, ISAS

    def bad(key: str, value: Any, expected: str) -> ArtifactError:
        shown = repr(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        return ArtifactError(
            f"{where}: runtime_options.native.{key} = {shown}: expected {expected}. The manifest was edited or "
            f"damaged. Fix: `{rebuild}`."
        )

    if not isinstance(nat, Mapping):
        raise bad("", nat, "an object {isa, library, weights_file, tensors, activation_levels}")
    for key in ("library", "weights_file"):
        if not isinstance(nat.get(key), str) or not nat.get(key):
            raise bad(key, nat.get(key), "a file name in the artifact")
    if nat.get("isa") not in ISAS:
        raise bad("isa", nat.get("isa"), " or ".join(repr(i) for i in ISAS))
    if not isinstance(nat.get("tensors"), Mapping):
        raise bad("tensors", nat.get("tensors"), "an object {name: [dtype, [size], offset]}")
    levels = nat.get("activation_levels")
    parsed: dict[str, ActivationLevels] = {}
    if isinstance(levels, Mapping) and set(levels) == {"prefill", "decode"}:
        for ph in ("prefill", "decode"):
            if (lv := ActivationLevels.parse(levels[ph])) is not None:
                parsed[ph] = lv
    if len(parsed) != 2:
        raise bad(
            "activation_levels", levels, "{prefill: L, decode: L}, L = 1, 2 or {attention: 1|2, mlp: 1|2, head: 1|2}"
        )
    form = nat.get("activation_form", "int8x2")
    if form not in ACT_FORMS:
        raise bad("activation_form", form, " or ".join(repr(f) for f in ACT_FORMS))
    return NativeOptions(nat["isa"], nat["library"], nat["weights_file"], dict(nat["tensors"]), parsed, form)


__all__ = [
    "ActivationLevels",
    "NativeOptions",
    "RuntimeOptions",
    "SharedInitializer",
    "parse_runtime_options",
    "REQUIRED_OPTIONS",
]
