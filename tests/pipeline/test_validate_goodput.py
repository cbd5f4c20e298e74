"""`trtpipe validate --goodput` end to end on the default artifact: a bounded search per Poisson
scenario, goodput.json and the latency-vs-rate plot next to the report; closed-loop scenarios
are skipped with a note; the exit code is the gate's."""

from __future__ import annotations

import json

import pytest
from test_validate import PNG_MAGIC, fake_artifact, invoke, write_recipe

pytestmark = pytest.mark.slow

VALIDATE = {
    "correctness": {"int4_teacher_forced_agreement_min": 0.5, "num_sequences": 4, "num_tokens": 64},
    "scenarios": [
        {
            "name": "loose",
            "num_requests": 2,
            "num_warmup_requests": 0,
            "prompt_tokens": 8,
            "output_tokens": 2,
            "arrival_rate_per_s": 4.0,
            "seed": 0,
            "budgets": {"ttft_ms": {"p50": 600000}},
        },
        {
            "name": "closed",
            "num_requests": 1,
            "num_warmup_requests": 0,
            "prompt_tokens": 8,
            "output_tokens": 2,
            "concurrency": 1,
            "seed": 0,
            "budgets": {"ttft_ms": {"p50": 600000}},
        },
    ],
}


def test_goodput_search_is_bounded_and_written(tmp_path, default_artifact):
    recipe = write_recipe(tmp_path, VALIDATE, name="goodput-test")
    art = fake_artifact(tmp_path, recipe, default_artifact)
    res = invoke(recipe, "--artifact", art, "--goodput", "--goodput-time-s", "120")
    assert res.exit_code == 0, res.output
    assert "closed-loop" in res.output and "goodput loose:" in res.output
    out = art / "validate"
    [doc] = json.loads((out / "goodput.json").read_text())
    # every probe passes a 600 s budget: the rate doubles until the probe limit (8)
    assert doc["scenario"] == "loose" and doc["stopped"] == "max_probes"
    rates = [p["rate_per_s"] for p in doc["probes"]]
    assert rates == [4.0 * 2**i for i in range(8)] and all(p["passed"] for p in doc["probes"])
    assert doc["goodput_requests_per_s"] == 512.0 and doc["bracket_requests_per_s"] == [512.0, None]
    assert (out / "goodput.png").read_bytes()[:8] == PNG_MAGIC
