"""Checks across recipe sections, each concern its own function; every problem is reported.

:func:`recipe_issues` needs only the recipe (run by :class:`Recipe`'s validator);
:func:`model_issues` needs the model's facts (run at load time for a recipe with inline
``model.architecture``, else by :func:`check_recipe_against_model` once a loader has read the model).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from trtpipe.pipeline.recipe.errors import Issue, RecipeError, issue_to_problem
from trtpipe.pipeline.recipe.kv_plan import kv_block_bytes
from trtpipe.pipeline.recipe.schema_build import TRT_ONLY_ENGINE_KEYS
from trtpipe.runtime.artifact.model_config import ModelConfig

if TYPE_CHECKING:
    from trtpipe.pipeline.recipe.schema import Recipe


NATIVE_SETTINGS = ("cpu_isa", "cpu_activation_levels")  # what the native engine reads (cpu_backend picks it)


def recipe_issues(r: Recipe) -> list[Issue]:
    """Checks that need several keys but not the model's facts (every one of them, in key order)."""
    target_issues = _cpu_target_issues(r) if r.target == "cpu" else _gpu_target_issues(r)
    return _kv_issues(r) + target_issues + _scenario_issues(r)


def _kv_issues(r: Recipe) -> list[Issue]:
    """sliding_window within max_seq_len; the KV pool sized one way and big enough for one sequence."""
    out: list[Issue] = []
    kv = r.kv_cache
    if r.sliding_window is not None and r.sliding_window > r.max_seq_len:
        out.append(
            Issue(
                ("sliding_window",),
                r.sliding_window,
                f"at most max_seq_len ({r.max_seq_len}); a wider window never drops a key",
                f"lower sliding_window to {r.max_seq_len} or less, or remove it to keep the model's window",
            )
        )
    if kv.num_blocks is not None and kv.memory_budget_mib is not None:
        out.append(
            Issue(
                ("kv_cache", "num_blocks"),
                kv.num_blocks,
                "either kv_cache.num_blocks or kv_cache.memory_budget_mib, not both",
                "remove one of them",
            )
        )
    elif kv.num_blocks is not None:
        need = r.max_blocks_per_seq + 1
        if kv.num_blocks < need:
            out.append(
                Issue(
                    ("kv_cache", "num_blocks"),
                    kv.num_blocks,
                    f"at least {need} (one max_seq_len={r.max_seq_len} sequence in "
                    f"blocks of {kv.block_size}, plus the null block 0)",
                    f"raise num_blocks to >= {need} or lower max_seq_len",
                )
            )
    return out


def _ort_session_issues(r: Recipe) -> list[Issue]:
    """One ONNX Runtime session (``ort_sessions: one``) or fused mixed steps need one graph for
    both phases: one precision (and, for one session, one MatMulNBits accuracy level)."""
    out: list[Issue] = []
    if r.engine.ort_sessions == "one" and r.precision.prefill != r.precision.decode:
        out.append(
            Issue(
                ("engine", "ort_sessions"),
                "one",
                "the same precision in both phases (decode runs through the prefill "
                f"graph), got prefill={r.precision.prefill} and decode={r.precision.decode}",
                "use `ort_sessions: two` (or auto), or set both phases to one precision",
            )
        )
    levels = {ph: r.engine.accuracy_level(ph) for ph in ("prefill", "decode")}
    if r.engine.ort_sessions == "one" and r.precision.prefill == r.precision.decode and len(set(levels.values())) > 1:
        out.append(
            Issue(
                ("engine", "ort_sessions"),
                "one",
                "one MatMulNBits accuracy level for both phases (decode runs through the prefill graph), "
                f"got engine.ort_accuracy_level prefill={levels['prefill']} and decode={levels['decode']}",
                "use `ort_sessions: two` (or auto), or one value: `ort_accuracy_level: 0` (or 4)",
            )
        )
    if r.engine.ort_fused_steps and r.precision.prefill != r.precision.decode:
        out.append(
            Issue(
                ("engine", "ort_fused_steps"),
                True,
                "the same precision in both phases (a mixed step's decode tokens run through the "
                f"prefill graph, other steps' through the decode graph), got prefill={r.precision.prefill} "
                f"and decode={r.precision.decode}",
                "set `ort_fused_steps: false`, or set both phases to one precision",
            )
        )
    return out


def _cpu_target_issues(r: Recipe) -> list[Issue]:
    """No bf16 phase and no TensorRT settings on the cpu target; one ORT session needs one precision.
    (Every KV dtype runs there: the native kernels and the ONNX Runtime graphs read fp16, bf16 and
    int8 pools.)"""
    out: list[Issue] = []
    for phase in ("prefill", "decode"):
        if getattr(r.precision, phase) == "bf16":
            out.append(
                Issue(
                    ("precision", phase),
                    "bf16",
                    "fp32, fp16 or int4 on the cpu target (ONNX Runtime's CPU provider has no bf16 MatMul kernels)",
                    f"use `{phase}: fp32` or `{phase}: int4`",
                )
            )
    out += _ort_session_issues(r)
    if r.profiles is not None:
        out.append(
            Issue(
                ("profiles",),
                r.profiles.model_dump(exclude_none=True),
                "no optimization profiles on the cpu target (ONNX Runtime graphs take any shape)",
                "remove profiles, or pick a GPU target (orin, a100, h200)",
            )
        )
    out += _engine_keys_set(
        r,
        TRT_ONLY_ENGINE_KEYS,
        "no TensorRT settings on the cpu target (it builds ONNX Runtime graphs)",
        "remove engine.{key}, or pick a GPU target",
    )
    if r.engine.cpu_backend == "ort":
        out += _engine_keys_set(
            r,
            NATIVE_SETTINGS,
            "native-engine settings only where the native engine is built (engine.cpu_backend: ort builds none)",
            "remove engine.{key}, or set engine.cpu_backend: auto",
        )
    return out


def _engine_keys_set(r: Recipe, keys: Sequence[str], expected: str, fix: str) -> list[Issue]:
    """An issue for each of ``keys`` the recipe sets under ``engine:`` (``fix`` formats ``{key}``); the
    value as the recipe writes it (a nested setting's plain dict, not the parsed model)."""
    values = {key: getattr(r.engine, key) for key in keys if key in r.engine.model_fields_set}
    as_written = {k: v.model_dump() if hasattr(v, "model_dump") else v for k, v in values.items()}
    return [Issue(("engine", k), v, expected, fix.format(key=k)) for k, v in as_written.items()]


def _gpu_target_issues(r: Recipe) -> list[Issue]:
    """No ONNX Runtime settings on GPU targets; the orin-only key; plugin-free INT4; layout; profiles; speculation."""
    out: list[Issue] = []
    if r.kv_cache.dtype == "int8":
        out.append(
            Issue(
                ("kv_cache", "dtype"),
                "int8",
                "fp16, bf16 or fp32 on GPU targets (the int8 pool's TensorRT plugins have their signature "
                "and Triton kernels, but no TensorRT build path yet)",
                "use `dtype: fp16`, or target: cpu for an int8 pool",
            )
        )
    if r.engine.intra_op_num_threads is not None:
        out.append(
            Issue(
                ("engine", "intra_op_num_threads"),
                r.engine.intra_op_num_threads,
                "no ONNX Runtime thread count on GPU targets",
                "remove engine.intra_op_num_threads, or use target: cpu",
            )
        )
    out += _engine_keys_set(
        r,
        (
            "ort_accuracy_level",
            "ort_float_zero_points",
            "ort_sessions",
            "ort_fused_steps",
            "cpu_backend",
            *NATIVE_SETTINGS,
        ),
        "no ONNX Runtime or host-CPU settings on GPU targets (they build TensorRT plans)",
        "remove engine.{key}, or use target: cpu",
    )
    if r.target != "orin" and "orin_trt_lt_10_7" in r.engine.model_fields_set:
        out.append(
            Issue(
                ("engine", "orin_trt_lt_10_7"),
                r.engine.orin_trt_lt_10_7,
                f"this key only on target orin (this recipe targets {r.target})",
                "remove engine.orin_trt_lt_10_7",
            )
        )
    out += _plugin_free_int4_issues(r)
    if r.engine.layout == "dual_profile" and r.precision.prefill != r.precision.decode:
        out.append(
            Issue(
                ("engine", "layout"),
                "dual_profile",
                "the same precision for prefill and decode (one plan, one copy of "
                f"the weights), got prefill={r.precision.prefill} and "
                f"decode={r.precision.decode}",
                "use `layout: split`, or set both phases to one precision",
            )
        )
    out += _profile_issues(r)
    out += _gpu_speculative_issues(r)
    return out


def _gpu_speculative_issues(r: Recipe) -> list[Issue]:
    """No ``runtime.speculative`` on GPU targets: a verify needs logits at every position of its chunk."""
    spec = r.runtime.speculative
    expected = (
        "no speculative decoding on GPU targets (TensorRT plans return logits for the last position of "
        "each sequence only, and verifying a proposal needs logits at every position of the chunk)"
    )
    fix = "remove runtime.speculative, or use target: cpu"
    return [] if spec is None else [Issue(("runtime", "speculative"), spec.model_dump(), expected, fix)]


def _scenario_issues(r: Recipe) -> list[Issue]:
    """Each scenario's longest prompt + longest output fits in max_seq_len."""
    out: list[Issue] = []
    for i, s in enumerate(r.validation.scenarios):
        longest = s.prompt_tokens.max_tokens
        if longest is not None and longest + s.output_tokens.max_tokens > r.max_seq_len:
            out.append(
                Issue(
                    ("validate", "scenarios", i, "prompt_tokens"),
                    longest,
                    f"longest prompt + longest output ({longest} + "
                    f"{s.output_tokens.max_tokens}) <= max_seq_len ({r.max_seq_len})",
                    "shorten the prompts or outputs, or raise max_seq_len",
                )
            )
    return out


def _plugin_free_int4_issues(r: Recipe) -> list[Issue]:
    """engine.plugin_free_int4 and its agreement gate come together, on a recipe that has a
    plugin-free INT4 variant."""
    out: list[Issue] = []
    e = r.engine
    c = r.validation.correctness
    gate = c.plugin_free_teacher_forced_agreement_min if c is not None else None
    gate_key = ("validate", "correctness", "plugin_free_teacher_forced_agreement_min")
    if e.plugin_free_int4 != "refuse":
        has_variant = e.plugin_free or (r.target == "orin" and e.orin_trt_lt_10_7 == "plugin_free")
        if not has_variant:
            out.append(
                Issue(
                    ("engine", "plugin_free_int4"),
                    e.plugin_free_int4,
                    "a recipe with a plugin-free variant (engine.plugin_free: true, or on orin "
                    "engine.orin_trt_lt_10_7: plugin_free)",
                    "remove engine.plugin_free_int4, or add a plugin-free variant",
                )
            )
        elif "int4" not in (r.precision.prefill, r.precision.decode):
            out.append(
                Issue(
                    ("engine", "plugin_free_int4"),
                    e.plugin_free_int4,
                    "an INT4 phase (there are no INT4 weights to re-quantize)",
                    "remove engine.plugin_free_int4",
                )
            )
        elif gate is None:
            out.append(
                Issue(
                    gate_key,
                    None,
                    f"a minimum teacher-forced agreement (0..1] for the plugin-free variant "
                    f"({e.plugin_free_int4}): it changes the weights, so the build measures it and "
                    "keeps the variant only above this gate",
                    "set validate.correctness.plugin_free_teacher_forced_agreement_min, e.g. 0.9",
                )
            )
    elif gate is not None:
        out.append(
            Issue(
                gate_key,
                gate,
                "this key only with engine.plugin_free_int4: requantize_symmetric or "
                "dequantize_float (it gates the plugin-free variant whose weights they change)",
                "remove it, or set engine.plugin_free_int4: dequantize_float",
            )
        )
    return out


def _profile_issues(r: Recipe) -> list[Issue]:
    p = r.profiles
    if p is None:
        return []
    out: list[Issue] = []
    # The scheduler may hand the engines anything up to the limits, so the profiles must accept
    # it; checked here so the user never meets a TensorRT shape error at run time.
    checks: list[tuple[Any, tuple[str, ...], int, str]] = []
    if p.prefill is not None:
        checks.append((p.prefill.tokens.max, ("prefill", "tokens", "max"), r.max_num_tokens, "max_num_tokens"))
    if p.decode is not None:
        checks.append((p.decode.batch.max, ("decode", "batch", "max"), r.max_batch_size, "max_batch_size"))
        checks.append((p.decode.context.max, ("decode", "context", "max"), r.max_seq_len, "max_seq_len"))
    for value, path, limit, limit_name in checks:
        if value < limit:
            out.append(
                Issue(
                    ("profiles",) + path,
                    value,
                    f"at least {limit_name} ({limit}): the scheduler may send that many",
                    f"raise profiles.{'.'.join(path)} to {limit} or lower {limit_name}",
                )
            )
    return out


def _int4_group_candidates(dims: Sequence[int]) -> list[int]:
    g = math.gcd(*dims)
    return [c for c in (16, 32, 64, 128, 256) if g % c == 0]


def model_issues(r: Recipe, config: ModelConfig, facts: str) -> list[Issue]:
    """Checks that need the model's facts; ``facts`` names where they came from."""
    out: list[Issue] = []
    ctx = config.max_position_embeddings
    if r.max_seq_len > ctx:
        out.append(
            Issue(
                ("max_seq_len",),
                r.max_seq_len,
                f"at most the model's context length {ctx} (max_position_embeddings, from {facts})",
                f"lower max_seq_len to {ctx} or less",
            )
        )
    if r.uses_int4:
        g = r.precision.int4.group_size
        # K of every quantized GEMM: q/k/v/gate/up (hidden), o_proj (heads*head_dim), down (ffn).
        dims = {
            "hidden_size": config.hidden_size,
            "num_heads*head_dim": config.num_heads * config.head_dim,
            "intermediate_size": config.intermediate_size,
        }
        bad = {k: v for k, v in dims.items() if v % g}
        if bad:
            cands = _int4_group_candidates(list(dims.values()))
            fix = (
                f"use group_size {' or '.join(map(str, cands))}"
                if cands
                else "this model's sizes admit no power-of-two group >= 16; use fp16 or fp32"
            )
            which = ", ".join(f"{k}={v}" for k, v in bad.items())
            out.append(
                Issue(
                    ("precision", "int4", "group_size"),
                    g,
                    f"a divisor of every INT4 GEMM's K; {which} (from {facts}) is not a multiple of {g}",
                    fix,
                )
            )
    if r.kv_cache.memory_budget_mib is not None:
        need = r.max_blocks_per_seq + 1
        per_block = kv_block_bytes(r, config)
        have = int(r.kv_cache.memory_budget_mib * 2**20 // per_block)
        if have < need:
            need_mib = math.ceil(need * per_block / 2**20)
            out.append(
                Issue(
                    ("kv_cache", "memory_budget_mib"),
                    r.kv_cache.memory_budget_mib,
                    f"room for one max_seq_len={r.max_seq_len} sequence plus the null "
                    f"block ({need} blocks of {per_block} bytes = {need_mib} MiB); it "
                    f"holds {have}",
                    f"raise memory_budget_mib to >= {need_mib} or lower max_seq_len",
                )
            )
    return out


def check_recipe_against_model(recipe: Recipe, config: ModelConfig) -> None:
    """Check the recipe against the model's facts (from the GGUF / config.json loader).

    Raises :class:`RecipeError` listing: ``max_seq_len`` beyond ``max_position_embeddings``;
    an INT4 ``group_size`` that does not divide hidden size, heads*head_dim or intermediate
    size; a ``kv_cache.memory_budget_mib`` too small for one sequence.
    """
    issues = model_issues(recipe, config, f"the model {config.name or recipe.model.source}")
    if issues:
        raise RecipeError(recipe.origin, [issue_to_problem((), i) for i in issues])
