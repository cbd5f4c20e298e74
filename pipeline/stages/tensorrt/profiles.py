"""Optimization profiles as objects (the way Polygraphy's ``Profile`` models them), derived from the
recipe and checked before TensorRT sees them.

Dynamic dimensions of the exported graphs (``pipeline/stages/export.py``) and their ranges::

    T    tokens in the batch       prefill: profiles.prefill.tokens      decode: = S
    S    sequences in the batch    prefill: profiles.prefill.sequences   decode: profiles.decode.batch
    S+1  query_start_loc length    S + 1
    MB   block-table width         prefill: 1 .. ceil(max_seq_len / block_size)
                                   decode: ceil(profiles.decode.context / block_size)
    NB   KV pool blocks            fixed: kv_cache num_blocks
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from trtpipe.pipeline.recipe import Recipe
from trtpipe.pipeline.stages.errors import BuildError
from trtpipe.runtime.kv.planning import cdiv

# dim_param names the exporter gives (pipeline/stages/export.py) -> profile dimension
DIM_NAMES = {"num_tokens": "T", "num_seqs": "S", "num_seqs + 1": "S+1", "max_blocks": "MB", "num_blocks": "NB"}

Shape = list[int]
ShapeRanges = dict[str, list[Shape]]  # input name -> [min shape, opt shape, max shape] (the spec's JSON form)


@dataclass(frozen=True)
class InputRange:
    """One input's shapes in a profile: every dimension as (min, opt, max)."""

    name: str
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]


@dataclass(frozen=True)
class OptimizationProfile:
    """One TensorRT optimization profile: the phase it serves and each input's shape range."""

    phase: str  # "prefill" | "decode"
    inputs: tuple[InputRange, ...]

    def add(self, name: str, min: Shape, opt: Shape, max: Shape) -> OptimizationProfile:
        """A copy with ``name``'s range added (Polygraphy's ``Profile.add``, as a frozen record)."""
        return OptimizationProfile(self.phase, self.inputs + (InputRange(name, tuple(min), tuple(opt), tuple(max)),))

    def shapes(self) -> ShapeRanges:
        return {r.name: [list(r.min), list(r.opt), list(r.max)] for r in self.inputs}

    def to_json(self) -> dict[str, Any]:
        return {"phase": self.phase, "shapes": self.shapes()}

    @classmethod
    def from_shapes(cls, phase: str, shapes: ShapeRanges) -> OptimizationProfile:
        p = cls(phase, ())
        for name, (lo, opt, hi) in shapes.items():
            p = p.add(name, lo, opt, hi)
        return p

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> OptimizationProfile:
        return cls.from_shapes(d["phase"], d["shapes"])

    def to_polygraphy(self) -> Any:
        """A ``polygraphy.backend.trt.Profile`` with the same ranges."""
        from polygraphy.backend.trt import Profile

        prof = Profile()
        for r in self.inputs:
            prof.add(r.name, list(r.min), list(r.opt), list(r.max))
        return prof


@dataclass(frozen=True)
class PlanSpec:
    """One plan to build: its graph file and optimization profiles, in profile-index order."""

    name: str  # "prefill" | "decode" | "engine", with ".plugin_free" for the second variant
    graph: str  # file in the spec folder
    profiles: tuple[OptimizationProfile, ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "graph": self.graph, "profiles": [p.to_json() for p in self.profiles]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PlanSpec:
        return cls(d["name"], d["graph"], tuple(OptimizationProfile.from_json(p) for p in d["profiles"]))


def profile_dims(recipe: Recipe, num_blocks: int, profile: str) -> dict[str, tuple[int, int, int]]:
    """(min, opt, max) of each dynamic dimension for one optimization profile.

    ``profile``: "prefill" (T = tokens, S = sequences, MB up to ceil(max_seq_len / block_size)) or
    "decode" (T = S = batch, MB from the decode context range). NB (the pool) is fixed."""
    p = recipe.resolved_profiles()
    bs = recipe.kv_cache.block_size
    mb_max = cdiv(recipe.max_seq_len, bs)
    if profile == "prefill":
        t, s = p.prefill.tokens, p.prefill.sequences
        T = (t.min, t.opt, t.max)
        S = (s.min, s.opt, s.max)
        MB = (1, min(mb_max, max(1, cdiv(t.opt, bs))), mb_max)
    elif profile == "decode":
        b, c = p.decode.batch, p.decode.context
        T = S = (b.min, b.opt, b.max)
        MB = (cdiv(c.min, bs), cdiv(c.opt, bs), cdiv(c.max, bs))
    else:
        raise ValueError(f"profile must be 'prefill' or 'decode', got {profile!r}")
    return {"T": T, "S": S, "S+1": (S[0] + 1, S[1] + 1, S[2] + 1), "MB": MB, "NB": (num_blocks,) * 3}


def input_shapes(inputs: list[tuple[str, list]], dims: dict[str, tuple[int, int, int]], *, where: str) -> ShapeRanges:
    """Per graph input ``[min, opt, max]`` shapes from its dims (ints or dim_param names).

    Raises :class:`BuildError` for a dynamic dim the profile does not cover."""
    out = {}
    for name, shape in inputs:
        lo, opt, hi = [], [], []
        for d in shape:
            if isinstance(d, int) and d > 0:
                a = b = c = d
            elif (key := DIM_NAMES.get(str(d))) is not None:
                a, b, c = dims[key]
            else:
                raise BuildError(
                    f"{where}: input {name} has a dynamic dimension {d!r} that no optimization profile "
                    f"covers (known: {sorted(DIM_NAMES)}). Fix: re-export the graphs with this trtpipe."
                )
            lo.append(a), opt.append(b), hi.append(c)
        out[name] = [lo, opt, hi]
    return out


def profile_for(
    recipe: Recipe, num_blocks: int, phase: str, input_dims: list[tuple[str, list]], *, where: str
) -> OptimizationProfile:
    """The ``phase`` profile of a graph whose inputs have ``input_dims``."""
    return OptimizationProfile.from_shapes(
        phase, input_shapes(input_dims, profile_dims(recipe, num_blocks, phase), where=where)
    )


def _min_size_problems(recipe: Recipe) -> list[str]:
    rp = recipe.resolved_profiles()
    out = []
    for key, value in (
        ("profiles.prefill.tokens.min", rp.prefill.tokens.min),
        ("profiles.prefill.sequences.min", rp.prefill.sequences.min),
        ("profiles.decode.batch.min", rp.decode.batch.min),
    ):
        if value != 1:
            out.append(
                f"{key} = {value}: expected 1 (the scheduler sends a single token or sequence when only "
                f"one is ready). Fix: set {key.rsplit('.', 1)[0]}.min: 1"
            )
    return out


def _shape_problems(plans: list[PlanSpec]) -> tuple[list[str], dict[str, int]]:
    """Per-token inputs that disagree, KV pool inputs that differ between profiles; and the
    block-table width (max) of each profile."""
    problems: list[str] = []
    pools: dict[str, tuple[str, list[Shape]]] = {}
    widths: dict[str, int] = {}
    for plan in plans:
        for prof in plan.profiles:
            shapes = prof.shapes()
            where = f"{plan.name} plan, {prof.phase} profile"
            for name in ("input_ids", "positions", "slot_mapping"):
                if name in shapes and shapes[name] != shapes["input_ids"]:
                    problems.append(
                        f"{where}: {name} {shapes[name]} differs from input_ids {shapes['input_ids']} "
                        "(both are one entry per token)"
                    )
            for name, s in shapes.items():
                prev = pools.get(name) if name.startswith("past_") else None
                if prev is not None and prev[1] != s:
                    problems.append(
                        f"{where}: KV pool input {name} has shapes {s} but {prev[0]} has {prev[1]}; "
                        "both engines must bind the same pool. Fix: rebuild the spec (one "
                        "kv_cache setting feeds both graphs)."
                    )
                if name.startswith("past_"):
                    pools.setdefault(name, (where, s))
            if "block_tables" in shapes:
                widths[where] = shapes["block_tables"][2][1]
    return problems, widths


def check_profiles(plans: list[PlanSpec], graph_dtypes: dict[str, dict[str, int]], recipe: Recipe) -> None:
    """Check, before TensorRT does, that the profiles are usable and agree on shared dimensions.

    Checked (every problem reported at once, each naming the recipe key to change):
    - the scheduler's smallest batches fit: prefill tokens/sequences and decode batch ``min`` = 1;
    - within a profile, inputs sharing a dimension get the same range (T, S, S+1, MB);
    - across all profiles (both graphs, or both profiles of one plan): the KV pool inputs have
      the same shapes and dtypes (``graph_dtypes``: graph -> input -> ONNX type id), and the
      block-table width reaches the same maximum (both phases read the same block tables).
    Raises :class:`BuildError`.
    """
    problems = _min_size_problems(recipe)
    shape_problems, widths = _shape_problems(plans)
    problems += shape_problems
    if len(set(widths.values())) > 1:
        desc = ", ".join(f"{w}: {v} blocks" for w, v in widths.items())
        bs = recipe.kv_cache.block_size
        problems.append(
            f"the profiles disagree on the block-table width (max blocks per sequence): {desc}. Both phases read the "
            f"block tables of the same sequences, up to max_seq_len {recipe.max_seq_len} / block_size {bs} = "
            f"{cdiv(recipe.max_seq_len, bs)} blocks. Fix: set profiles.decode.context.max to {recipe.max_seq_len} "
            "(= max_seq_len)."
        )
    dts = {g: {n: t for n, t in d.items() if n.startswith("past_")} for g, d in graph_dtypes.items()}
    if len({json.dumps(d, sort_keys=True) for d in dts.values()}) > 1:
        kinds = {g: sorted(set(d.values())) for g, d in dts.items()}
        problems.append(
            f"the graphs disagree on the KV pool dtype ({kinds} as ONNX type ids). "
            "Fix: set kv_cache.dtype to the activation dtype of both phases."
        )
    if problems:
        raise BuildError(
            "optimization profiles of recipe " + recipe.name + " cannot work:\n  - " + "\n  - ".join(problems)
        )
