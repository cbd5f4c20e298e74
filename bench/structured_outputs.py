"""Structured outputs on the real model: schema conformance x/50 at temperature 0 and 1, and the
per-step cost of the grammar masks as % of TPOT at batch 1 and 8 (in-process, the LLM API).

    python bench/structured_outputs.py [ARTIFACT] [--num-schemas 50] [--seed 0]

The 50 schemas come from :func:`make_schemas` (fixed seed): objects with required fields,
integers and numbers with bounds, enums, string patterns, bounded strings, arrays and nested
objects. Every output must parse as JSON and validate against its schema (``jsonschema``).
Cost: ``LLM.grammar_time_s`` (llguidance mask fill + matcher advance) per step plus the NumPy
bitmask application (timed alone on B rows), against the median TPOT of the same run (B
constrained rows); the unconstrained run of the same batch is printed beside it. Numbers vary +-15-25 % on a shared 2-core host: compare within one run.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

FIELD_NAMES = ["name", "city", "color", "code", "count", "price", "tags", "owner", "active", "level", "score", "id"]


def _leaf(rng: random.Random, depth: int) -> dict:
    kind = rng.choice(["int", "num", "enum", "pattern", "str", "bool", "array", "object"][: 8 if depth < 2 else 6])
    if kind == "int":
        lo = rng.randint(-50, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(1, 500)}
    if kind == "num":
        lo = rng.randint(0, 100)
        return {"type": "number", "minimum": lo, "maximum": lo + rng.randint(1, 1000)}
    if kind == "enum":
        return {"type": "string", "enum": rng.sample(["red", "green", "blue", "small", "large", "yes", "no"], 3)}
    if kind == "pattern":
        return {
            "type": "string",
            "pattern": rng.choice(["^[A-Z]{3}-[0-9]{2}$", "^[a-z]{1,12}@example\\.com$", "^v[0-9]\\.[0-9]$"]),
        }
    if kind == "str":
        return {"type": "string", "minLength": 1, "maxLength": rng.randint(5, 20)}
    if kind == "bool":
        return {"type": "boolean"}
    if kind == "array":
        return {"type": "array", "items": _leaf(rng, depth + 1), "minItems": 1, "maxItems": rng.randint(2, 3)}
    return _object(rng, depth + 1)


def _object(rng: random.Random, depth: int = 0) -> dict:
    names = rng.sample(FIELD_NAMES, rng.randint(2, 4 if depth == 0 else 2))
    props = {n: _leaf(rng, depth) for n in names}
    required = [n for n in names if rng.random() < 0.7] or names[:1]
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


def make_schemas(num: int = 50, seed: int = 0) -> list[dict]:
    """``num`` JSON schemas (objects at the top), the same for the same seed."""
    rng = random.Random(seed)
    return [_object(rng) for _ in range(num)]


def prompt_for(schema: dict) -> str:
    return "Reply with one JSON object that follows this JSON schema, and nothing else:\n" + json.dumps(schema)


def conformance(llm, schemas: list[dict], temperature: float, seed: int, max_new_tokens: int = 256) -> tuple[int, list]:
    """(how many outputs parse and validate, failures as (index, reason, text))."""
    import jsonschema

    from trtpipe.runtime.sample.params import SamplingParams
    from trtpipe.runtime.sample.structured import StructuredOutput

    params = [
        SamplingParams(
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=seed + i,
            structured=StructuredOutput.json_schema(s),
        )
        for i, s in enumerate(schemas)
    ]
    outs = llm.generate([prompt_for(s) for s in schemas], params, chat=True)
    ok, failures = 0, []
    for i, (s, out) in enumerate(zip(schemas, outs)):
        try:
            jsonschema.validate(json.loads(out.text), s)
            ok += 1
        except Exception as e:  # noqa: BLE001 - every failure is reported with its reason
            failures.append((i, f"{type(e).__name__}: {str(e)[:120]} (finish {out.finish_reason})", out.text[:200]))
    return ok, failures


def _run(llm, schemas: list[dict], batch: int, structured: bool, num_tokens: int) -> dict:
    """One batch of ``batch`` requests: ms of grammar work per step and the median TPOT."""
    from trtpipe.runtime.sample.params import SamplingParams
    from trtpipe.runtime.sample.structured import StructuredOutput

    params = [
        SamplingParams(max_new_tokens=num_tokens, structured=StructuredOutput.json_schema(s) if structured else None)
        for s in schemas[:batch]
    ]
    g0, s0 = llm.grammar_time_s, llm.steps
    outs = llm.generate([prompt_for(s) for s in schemas[:batch]], params, chat=True)
    steps = llm.steps - s0
    tpots = sorted(o.metrics.tpot_s for o in outs if o.metrics and o.metrics.tpot_s)
    return {"grammar_ms_per_step": 1e3 * (llm.grammar_time_s - g0) / steps, "tpot_ms": 1e3 * tpots[len(tpots) // 2]}


def step_cost(llm, schemas: list[dict], batch: int, num_tokens: int = 48, repeats: int = 3) -> dict:
    """Structured-output cost per step at ``batch`` rows: llguidance's mask fill + matcher advance
    (``LLM.grammar_time_s`` per step) plus the NumPy bitmask application, as % of the median TPOT
    of the same batch unconstrained. Constrained and free runs alternate ``repeats`` times (the
    host is shared: medians of interleaved runs)."""
    runs: dict[str, list[dict]] = {"free": [], "schema": []}
    for _ in range(repeats):
        runs["free"].append(_run(llm, schemas, batch, False, num_tokens))
        runs["schema"].append(_run(llm, schemas, batch, True, num_tokens))

    def median(label: str, key: str) -> float:
        values = sorted(r[key] for r in runs[label])
        return values[len(values) // 2]

    grammar_ms = median("schema", "grammar_ms_per_step") + mask_apply_ms(batch, llm.tokenizer.vocab_size)
    tpot_free = median("free", "tpot_ms")
    return {
        "grammar_ms_per_step": grammar_ms,
        "tpot_ms_free": tpot_free,
        "tpot_ms_schema": median("schema", "tpot_ms"),
        "grammar_pct_of_tpot": 100 * grammar_ms / tpot_free,
    }


def mask_apply_ms(batch: int, vocab: int, repeats: int = 200) -> float:
    """Median ms of the sampler's bitmask application (processors.apply_bitmask) on ``batch`` rows:
    the NumPy half of the cost, outside ``LLM.grammar_time_s``."""
    import numpy as np

    from trtpipe.runtime.sample.processors import apply_bitmask

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(batch, vocab)).astype(np.float32)
    bitmask = rng.integers(-(2**31), 2**31, size=(batch, (vocab + 31) // 32)).astype(np.int32)
    rows = np.arange(batch)
    times = []
    for _ in range(repeats):
        x = logits.copy()
        t0 = time.perf_counter()
        apply_bitmask(x, bitmask, rows)
        times.append(time.perf_counter() - t0)
    return 1e3 * sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifact", nargs="?", default="artifacts/smollm2-135m-cpu/cpu")
    ap.add_argument("--num-schemas", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-conformance", action="store_true")
    a = ap.parse_args()
    from trtpipe.runtime.llm import LLM

    llm = LLM(Path(a.artifact))
    schemas = make_schemas(a.num_schemas, a.seed)
    report: dict = {"num_schemas": len(schemas)}
    for batch in (1, 8):
        report[f"cost_batch_{batch}"] = step_cost(llm, schemas, batch)
        print(f"batch {batch}: {json.dumps(report[f'cost_batch_{batch}'])}", flush=True)
    if not a.skip_conformance:
        for temperature in (0.0, 1.0):
            ok, failures = conformance(llm, schemas, temperature, a.seed)
            report[f"conformance_t{temperature:g}"] = {"ok": ok, "of": len(schemas), "failures": failures}
            print(f"temperature {temperature:g}: {ok}/{len(schemas)} parse and validate", flush=True)
            for f in failures:
                print("   ", f, flush=True)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
