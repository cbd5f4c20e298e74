"""``trtpipe info``: an artifact's manifest summary (table or ``--json``)."""

from __future__ import annotations

from pathlib import Path

import click

from trtpipe.pipeline.artifact.locate import resolve_artifact
from trtpipe.pipeline.cli.common import artifacts_option, fail
from trtpipe.plugins.core.dtypes import dtype
from trtpipe.plugins.core.errors import TrtpipeError
from trtpipe.runtime.artifact.runtime_options import ActivationLevels


def _info_summary(m) -> dict:
    """The manifest facts ``trtpipe info`` shows (plain JSON types)."""
    bi = m.build_info or {}
    return {
        "artifact": str(Path(m.root).resolve()) if m.root else None,
        "recipe": m.recipe_name,
        "build_hash": bi.get("build_hash"),
        "recipe_hash": m.recipe_hash,
        "target": m.target,
        "backend": m.backend,
        "model": {
            "name": m.model.name,
            "num_layers": m.model.num_layers,
            "hidden_size": m.model.hidden_size,
            "vocab_size": m.model.vocab_size,
            "chat_template": bool(m.model.chat_template),
        },
        "graphs": {ph: {"file": g.file, "precision": g.precision} for ph, g in m.graphs.items()},
        "engine": _engine_summary(m.options),
        "kv": {
            "num_blocks": m.kv.num_blocks,
            "block_size": m.kv.block_size,
            "dtype": m.kv.dtype,
            "sliding_window": m.kv.sliding_window,
            "pool_bytes": m.kv.pool_bytes,
        },
        "limits": m.limits.to_dict(),
        "built_at": bi.get("built_at"),
        "host": bi.get("host"),
        "rebuild_command": m.rebuild_command,
        "trtpipe_version": m.trtpipe_version,
    }


def _engine_summary(o) -> dict:
    """The runtime options that change how steps run (``manifest.runtime_options``, typed)."""
    if o.backend == "ort":
        nat = o.native
        return {
            "runs_on": "native" if nat is not None else "ort",
            "native": None
            if nat is None
            else {"isa": nat.isa, "activation_levels": {ph: lv.to_json() for ph, lv in nat.activation_levels.items()}},
            "decode_steps_graph": o.ort_decode_graph,
            "fused_mixed_steps": bool(o.ort_fused_steps),
            "intra_op_num_threads": o.intra_op_num_threads,
        }
    return {"layout": o.layout, "kv_in_place": o.kv_in_place}


def _backend_row(m) -> str:
    """The manifest's backend, and the native engine beside it where the artifact has one."""
    ort = f"{m.backend.get('name')} {m.backend.get('version', '')}".strip()
    native = m.options.native if m.options.backend == "ort" else None
    return f"native CPU engine ({native.isa}), {ort} graphs beside it" if native else ort


def _engine_rows(e: dict) -> list[tuple[str, str]]:
    """The table's engine rows: the native CPU engine (when built) and the ONNX Runtime one."""
    if "fused_mixed_steps" not in e:
        return [("engine", f"layout {e['layout']}, KV written in place {'yes' if e['kv_in_place'] else 'no'}")]
    threads = e["intra_op_num_threads"] or "ONNX Runtime's default"
    ort = (
        f"decode steps on the {e['decode_steps_graph']} graph; mixed steps fused "
        f"(engine.ort_fused_steps) {'yes' if e['fused_mixed_steps'] else 'no'}; threads {threads}"
    )
    if not e.get("native"):
        return [("engine", ort)]
    n = e["native"]
    levels = ", ".join(f"{p} {ActivationLevels.parse(n['activation_levels'][p])}" for p in ("prefill", "decode"))
    native = (
        f"native CPU kernels for {n['isa']} (int8 activation levels: {levels}; threads "
        f"{e['intra_op_num_threads'] or 'one per CPU this process may use'})"
    )
    return [("engine", native), ("--engine ort", ort)]


@click.command("info")
@click.argument("recipe_or_artifact")
@artifacts_option
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
def info_cmd(recipe_or_artifact: str, artifact_root: str, as_json: bool) -> None:
    """Show an artifact's manifest summary (recipe and build hash, backend, target, model,
    precision per phase, engine options (e.g. fused mixed steps), KV pool, limits, when and
    where it was built).

    \b
    RECIPE_OR_ARTIFACT: a recipe (its artifact must be built from it) or an artifact directory.
    Example: trtpipe info smollm2-135m-cpu --json
    """
    import json

    from rich.console import Console
    from rich.table import Table

    from trtpipe.runtime.artifact.manifest import load_manifest

    try:
        m = load_manifest(resolve_artifact(recipe_or_artifact, artifact_root))
    except TrtpipeError as e:
        fail(e)
    d = _info_summary(m)
    if as_json:
        click.echo(json.dumps(d, indent=2))
        return
    kv, model = d["kv"], d["model"]
    rows = [
        ("artifact", d["artifact"]),
        ("recipe", f"{d['recipe']} (build hash {(d['build_hash'] or d['recipe_hash'])[:12]})"),
        (
            "target",
            f"{m.target.get('name')} ({m.target.get('platform')}"
            + (f", sm_{m.target['sm']})" if m.target.get("sm") else ")"),
        ),
        ("backend", _backend_row(m)),
        (
            "model",
            f"{model['name']}: {model['num_layers']} layers, hidden {model['hidden_size']}, "
            f"vocab {model['vocab_size']}, chat template {'yes' if model['chat_template'] else 'no'}",
        ),
        *((f"{ph} graph", f"{g['file']} ({g['precision']})") for ph, g in d["graphs"].items()),
        *_engine_rows(d["engine"]),
        (
            "KV pool",
            f"{kv['num_blocks']} blocks x {kv['block_size']} tokens, {dtype(kv['dtype']).name}, "
            f"{kv['pool_bytes'] / 2**20:.0f} MiB"
            + (f", window {kv['sliding_window']}" if kv["sliding_window"] else ""),
        ),
        ("limits", ", ".join(f"{k} {v}" for k, v in d["limits"].items())),
        ("built", f"{d['built_at'] or '?'} on {d['host'] or '?'} (trtpipe {d['trtpipe_version']})"),
        ("rebuild", d["rebuild_command"]),
    ]
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for k, v in rows:
        table.add_row(k, v)
    Console(highlight=False).print(table)
