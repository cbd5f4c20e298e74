"""``trtpipe estimate``'s printout: the target line, the memory table, the latency table, then
notes and warnings (yellow). Rich markup; every value comes from the :class:`Estimate`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtpipe.pipeline.estimate.memory import build_host_formula
from trtpipe.pipeline.estimate.model_counts import kv_bytes_per_layer
from trtpipe.pipeline.estimate.result import Estimate
from trtpipe.pipeline.estimate.units import fmt_bytes, fmt_flops, fmt_ms
from trtpipe.pipeline.estimate.weights import PhaseWeights
from trtpipe.pipeline.recipe import Recipe
from trtpipe.pipeline.targets import compute_dtype
from trtpipe.plugins.core.kv_codec import KV_SCALE_BYTES, kv_has_scales
from trtpipe.runtime.artifact.model_config import ModelConfig

LATENCY_COLUMNS = (
    ("scenario", "left"),
    ("metric", "left"),
    ("pct", "left"),
    ("prompt", "right"),
    ("context", "right"),
    ("batch", "right"),
    ("floor", "right"),
    ("predicted", "right"),
    ("bound", "left"),
    ("budget", "right"),
)


def _weights_detail(w: PhaseWeights, recipe: Recipe, family: str) -> str:
    if w.precision == "int4":
        g = recipe.precision.int4
        codes = "int4"
        if family == "cpu" and recipe.engine.ort_float_zero_points == "int8":
            codes, fmt = "int4 as 8-bit codes", "fp32 scale + uint8 zero point"
        elif family == "cpu":
            fmt = "fp32 scale + 4-bit zero point + fp32 min"
        else:
            fmt = "fp16 scale" + ("" if g.symmetric else " + 4-bit zero point")
        lin = f"{codes} GEMMs {fmt_bytes(w.linear_bytes)} + {fmt_bytes(w.int4_group_bytes)} ({fmt} per {g.group_size})"
    else:
        lin = f"{w.precision} GEMMs {fmt_bytes(w.linear_bytes)}"
    eight_bit = "8-bit " if w.precision == "int4" and family == "cpu" else ""
    head = "lm_head tied" if w.lm_head_bytes == 0 else f"{eight_bit}lm_head {fmt_bytes(w.lm_head_bytes)}"
    return (
        f"{lin}; {w.activation_dtype} embedding {fmt_bytes(w.embedding_bytes)}, {head}; "
        f"decode-step read {fmt_bytes(w.step_read_bytes)}"
    )


def _print_header(est: Estimate, recipe: Recipe, console: Any) -> None:
    from rich.markup import escape

    tg = est.target
    cd_pre = compute_dtype(recipe.precision.prefill, tg.family)
    kind = "measured" if tg.measured else "published peak"
    console.print(
        f"[bold]estimate[/bold] {escape(est.recipe_name)} ({escape(est.model_name)}) "
        f"on [bold]{escape(tg.name)}[/bold]: {escape(tg.description)}"
    )
    console.print(
        f"  bandwidth {tg.bandwidth_bytes_per_s / 1e9:.1f} GB/s ({kind}) x "
        f"{tg.bandwidth_fraction:g} achievable; {cd_pre} "
        f"{fmt_flops(tg.flops_per_s(cd_pre))} ({kind}) x {tg.flops_fraction:g} "
        f"achievable; memory {fmt_bytes(tg.memory_bytes)} - "
        f"{fmt_bytes(tg.reserved_bytes)} reserved = {fmt_bytes(tg.usable_memory_bytes)} usable"
    )
    console.print(f"  [dim]source: {escape(tg.source)}[/dim]")


def _weight_rows(est: Estimate, recipe: Recipe) -> list[tuple[str, str, str]]:
    from rich.markup import escape

    fam = est.target.family
    rows = [
        (f"weights, {ph} ({w.precision})", fmt_bytes(w.total_bytes), escape(_weights_detail(w, recipe, fam)))
        for ph, w in (("prefill", est.prefill), ("decode", est.decode))
    ]
    if fam == "cpu":
        return rows + [
            (
                "weights in the artifact",
                fmt_bytes(est.engine_weight_bytes),
                "one weights.data; identical tensors of both phases stored once",
            )
        ]
    dual = est.engine_weight_bytes_dual_profile
    return rows + [
        (
            f"weights, split{' (recipe)' if est.layout == 'split' else ''}",
            fmt_bytes(est.engine_weight_bytes_split),
            "two plans, each with its own copy",
        ),
        (
            f"weights, dual_profile{' (recipe)' if est.layout == 'dual_profile' else ''}",
            fmt_bytes(dual),
            "one plan, one copy" if dual is not None else "n/a: needs the same precision in both phases",
        ),
    ]


def _kv_rows(est: Estimate, recipe: Recipe, config: ModelConfig) -> list[tuple[str, str, str]]:
    kv, seq = est.kv, recipe.max_seq_len
    layers = kv.bytes_per_token_layers
    if len(set(layers)) == 1:
        how = f"2 x {config.num_layers} layers x {config.layer_num_kv_heads[0]} kv heads x " + (
            f"({config.head_dim} x {kv.dtype_bytes} B + {KV_SCALE_BYTES} B scale)"
            if kv_has_scales(kv.dtype)
            else f"{config.head_dim} x {kv.dtype_bytes} B"
        )
    else:
        groups: dict[int, int] = {}
        for b in layers:
            groups[b] = groups.get(b, 0) + 1
        how = "per layer: " + ", ".join(f"{n} layers x {b} B" for b, n in groups.items())
    rows = [(f"KV per token ({kv.dtype})", f"{kv.bytes_per_token:,} B", how)]
    per_layer = kv_bytes_per_layer(config, seq, kv.dtype)
    windows = sorted({w for w in config.layer_sliding_window if w > 0})
    wnote = f"; windowed layers capped at {', '.join(map(str, windows))}" if windows else ""
    if len(set(per_layer)) == 1:
        rows.append((f"KV per layer, {seq} tokens", fmt_bytes(per_layer[0]), f"x {config.num_layers} layers{wnote}"))
    rows.append(
        (
            f"KV per sequence ({seq} tokens)",
            fmt_bytes(kv.bytes_per_sequence),
            f"{kv.blocks_per_sequence} blocks of {recipe.kv_cache.block_size} tokens "
            f"({fmt_bytes(kv.block_bytes)} each) in the pool{wnote}",
        )
    )
    rows.append(
        (
            "KV pool",
            fmt_bytes(kv.pool_bytes),
            f"{kv.pool_num_blocks} blocks (null block included): {kv.pool_max_sequences} sequences of "
            f"{seq} tokens (max_batch_size {recipe.max_batch_size})",
        )
    )
    return rows


def _total_rows(est: Estimate, recipe: Recipe) -> list[tuple[str, str, str]]:
    act = est.activations
    scores = f" incl. scores {fmt_bytes(act.scores_bytes)}" if act.scores_bytes else ""
    rows = [
        (
            f"activations, prefill ({recipe.max_num_tokens} tokens)",
            fmt_bytes(act.prefill_bytes),
            f"tokens x (hidden + 2 FFN + qkv) x {est.prefill.activation_dtype} + last-token logits{scores}",
        ),
        (
            f"activations, decode (batch {recipe.max_batch_size})",
            fmt_bytes(act.decode_bytes),
            "batch x (hidden + 2 FFN + qkv) + logits",
        ),
    ]
    if est.target.family == "cpu":
        rows.append(
            (
                "[bold]engine total[/bold]",
                f"[bold]{fmt_bytes(est.engine_bytes)}[/bold]",
                "weights + KV pool + activations",
            )
        )
    else:
        for lay, val in (("split", est.engine_bytes_split), ("dual_profile", est.engine_bytes_dual_profile)):
            tag = " (recipe)" if lay == est.layout else ""
            rows.append(
                (
                    f"[bold]engine total, {lay}{tag}[/bold]",
                    f"[bold]{fmt_bytes(val)}[/bold]",
                    "weights + KV pool + activations",
                )
            )
    rows.append(
        (
            "host memory to build",
            fmt_bytes(est.build_host_bytes),
            f"{build_host_formula(est.target.family)}; trtpipe farm refuses nodes with less",
        )
    )
    verdict = "[green]fits[/green]" if est.fits else "[red]does not fit[/red]"
    rows.append(
        (
            "usable memory",
            fmt_bytes(est.usable_memory_bytes),
            f"{verdict}; room for {est.max_sequences} sequences of {recipe.max_seq_len} "
            "tokens beside the weights and activations",
        )
    )
    return rows


def _memory_table(est: Estimate, recipe: Recipe, config: ModelConfig) -> Any:
    from rich.table import Table

    mem = Table(title="memory (1 MB = 10^6 B)", title_justify="left", show_lines=False)
    for col in ("item", "bytes", "how"):
        mem.add_column(col, justify="right" if col == "bytes" else "left")
    for row in _weight_rows(est, recipe) + _kv_rows(est, recipe, config) + _total_rows(est, recipe):
        mem.add_row(*row)
    return mem


def _latency_table(est: Estimate, measured: bool) -> Any:
    from rich.table import Table

    lat = Table(
        title="latency, ms",
        title_justify="left",
        caption="floor: peak rates, batch 1 (no engine is faster); predicted: "
        "achievable rates, the scenario's decode batch, no queueing",
        caption_justify="left",
    )
    for col, just in LATENCY_COLUMNS + ((("measured", "right"), ("pred/meas", "right")) if measured else ()):
        lat.add_column(col, justify=just)  # type: ignore[arg-type]
    for r in est.latencies:
        budget = fmt_ms(r.budget_ms)
        if r.budget_ms is not None and r.budget_ms < r.floor_ms:
            budget = f"[red]{budget}[/red]"
        elif r.budget_ms is not None and r.budget_ms < r.predicted_ms:
            budget = f"[yellow]{budget}[/yellow]"
        tpot = r.metric == "tpot_ms"
        cells = [
            r.scenario,
            r.metric,
            r.percentile,
            str(r.prompt_tokens),
            str(r.context_tokens) if tpot else "–",
            str(r.batch) if tpot else "1",
            fmt_ms(r.floor_ms),
            fmt_ms(r.predicted_ms),
            r.bound,
            budget,
        ]
        if measured:
            cells += [fmt_ms(r.measured_ms), "–" if r.ratio is None else f"{r.ratio:.2f}"]
        lat.add_row(*cells)
    return lat


def render(est: Estimate, recipe: Recipe, config: ModelConfig, console: Any, report_path: Path | None = None) -> None:
    """Print ``est`` as rich tables (memory, latency), then notes and warnings (yellow)."""
    from rich.markup import escape

    _print_header(est, recipe, console)
    console.print(_memory_table(est, recipe, config))
    if est.latencies:
        measured = any(r.measured_ms is not None for r in est.latencies)
        console.print(_latency_table(est, measured))
        if measured and report_path is not None:
            console.print(
                f"  [dim]measured: {escape(str(report_path))} (calibration: "
                "pred/meas < 1 means the model is optimistic)[/dim]"
            )
    for n in est.notes:
        console.print(f"  [dim]note: {escape(n)}[/dim]")
    for w in est.warnings:
        console.print(f"[yellow]warning: {escape(w.message)}[/yellow]")
    if est.exit_code:
        console.print("[yellow]exit 1: the recipe does not fit or has a budget below the physical floor[/yellow]")
