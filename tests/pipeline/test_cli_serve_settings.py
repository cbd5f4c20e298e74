"""`trtpipe serve RECIPE` applies the recipe's runtime settings (runtime.prefix_caching,
runtime.scheduler.policy, runtime.scheduler.tpot_budget_ms, runtime.scheduler.itl_budget_ms); an artifact folder gets the defaults; the CLI flags
override either. End to end: a recipe with prefix caching off serves two chats sharing a long
system prompt with 0 cached tokens, and the start line names the slo chunk size."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import httpx
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from serve_util import ServerProcess, read_metrics  # noqa: E402

pytestmark = pytest.mark.slow
pytest.importorskip("uvicorn")


SCHEDULER_KEYS = ("policy", "tpot_budget_ms", "itl_budget_ms", "itl_during_prefill_ratio")


def _recipe(tmp_path: Path, **runtime) -> Path:
    """The default recipe (same name and build settings, so the same artifact) with runtime settings."""
    from trtpipe.pipeline.recipe import resolve_recipe_path

    data = yaml.safe_load(Path(resolve_recipe_path("smollm2-135m-cpu")).read_text())
    data["runtime"] = {
        "prefix_caching": runtime.get("prefix_caching", True),
        "scheduler": {k: v for k, v in runtime.items() if k in SCHEDULER_KEYS},
    }
    if "speculative" in runtime:
        data["runtime"]["speculative"] = runtime["speculative"]
    path = tmp_path / "serve-settings.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_settings_from_recipe_and_artifact_defaults(tmp_path, default_artifact):
    from trtpipe.pipeline.cli.serve import serve_settings
    from trtpipe.runtime.speculative.config import SpeculativeConfig

    root = default_artifact.parent.parent
    art, settings, source = serve_settings(
        str(_recipe(tmp_path, prefix_caching=False, policy="fcfs", tpot_budget_ms=40, itl_budget_ms=90)), str(root)
    )
    assert art == default_artifact and source == "recipe 'smollm2-135m-cpu' (its runtime section)"
    assert settings == {
        "prefix_caching": False,
        "scheduler_policy": "fcfs",
        "tpot_budget_ms": 40,
        "itl_budget_ms": 90,
        "itl_during_prefill_ratio": None,
        "speculative": None,
    }
    _, settings, _ = serve_settings(str(_recipe(tmp_path, itl_during_prefill_ratio=1.5)), str(root))
    assert settings["itl_during_prefill_ratio"] == 1.5 and settings["scheduler_policy"] == "slo"
    _, settings, _ = serve_settings(str(_recipe(tmp_path, speculative={"max_k": 3})), str(root))
    assert settings["speculative"] == SpeculativeConfig(max_k=3, min_n=2, max_n=4)
    art, settings, source = serve_settings(str(default_artifact), "unused")
    assert art == default_artifact and source.startswith("the defaults")
    assert settings == {
        "prefix_caching": True,
        "scheduler_policy": "slo",
        "tpot_budget_ms": None,
        "itl_budget_ms": None,
        "itl_during_prefill_ratio": None,
        "speculative": None,
    }


def test_serve_recipe_without_prefix_caching_and_slo_override(tmp_path, default_artifact):
    recipe = _recipe(tmp_path, prefix_caching=False, policy="fcfs")
    system = "You answer questions about French geography in one short sentence. " * 6
    with ServerProcess(
        recipe,
        "--artifacts",
        str(default_artifact.parent.parent),
        "--scheduler-policy",
        "slo",
        "--tpot-budget-ms",
        "50",
        "--itl-budget-ms",
        "100",
    ) as s:
        text = "".join(s.lines)
        assert (
            "runtime settings from recipe 'smollm2-135m-cpu' (its runtime section); overridden: "
            "scheduler_policy=slo, tpot_budget_ms=50.0, itl_budget_ms=100.0"
        ) in text
        assert (
            "prefix caching off; scheduler slo; prefill chunks: slo: TPOT budget 50 ms; ITL budget "
            "100 ms: steps up to 80 ms"
        ) in text
        cached = []
        for q in ("Where is Lyon?", "Where is Lille?"):
            r = httpx.post(
                s.url + "/v1/chat/completions",
                timeout=120,
                json={
                    "model": "smollm2-135m-cpu",
                    "max_tokens": 4,
                    "temperature": 0,
                    "messages": [{"role": "system", "content": system}, {"role": "user", "content": q}],
                },
            )
            assert r.status_code == 200, r.text
            cached.append(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
        assert cached == [0, 0]
        m = read_metrics(httpx.get(s.url + "/metrics", timeout=10).text)
        assert m["trtpipe:prefix_cache_hits_total"] == 0 and m["trtpipe:prefix_cache_queries_total"] == 0


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--itl-budget-ms", "100", "--tpot-budget-ms", "50", "--scheduler-policy", "fcfs"],
            "error: --itl-budget-ms 100 has no effect: the scheduler policy is fcfs, and the ITL budget only "
            "sizes the slo policy's steps. Fix: add --scheduler-policy slo, or drop --itl-budget-ms",
        ),
        (
            ["--itl-budget-ms", "nan", "--tpot-budget-ms", "50"],
            "Invalid value for '--itl-budget-ms': nan: expected a finite number of ms > 0, e.g. 100",
        ),
        (
            ["--tpot-budget-ms", "inf"],
            "Invalid value for '--tpot-budget-ms': inf: expected a finite number of ms > 0, e.g. 50",
        ),
        (
            ["--itl-during-prefill-ratio", "1.5", "--scheduler-policy", "fcfs"],
            "error: --itl-during-prefill-ratio 1.5 has no effect: the scheduler policy is fcfs, and the "
            "ITL-during-prefill ratio only sizes the slo policy's steps. Fix: add --scheduler-policy slo, or drop "
            "--itl-during-prefill-ratio",
        ),
        (
            ["--itl-during-prefill-ratio", "inf"],
            "Invalid value for '--itl-during-prefill-ratio': inf: expected a finite number > 1 (the longest step "
            "beside decodes over the decode-only step), e.g. 1.5",
        ),
        (
            ["--itl-during-prefill-ratio", "1"],
            "Invalid value for '--itl-during-prefill-ratio': 1.0: expected a finite number > 1 (the longest step "
            "beside decodes over the decode-only step), e.g. 1.5",
        ),
    ],
)
def test_serve_refuses_an_itl_budget_that_would_do_nothing_and_non_finite_budgets(default_artifact, flags, message):
    """Exit 2 before the model loads: an --itl-budget-ms under fcfs was silently dropped; NaN passed
    click's range check and left a server answering 503."""
    from click.testing import CliRunner

    from trtpipe.pipeline.cli.main import main

    res = CliRunner().invoke(main, ["serve", str(default_artifact), "--port", "0", *flags])
    assert res.exit_code == 2
    assert message in " ".join(res.output.split())
    assert "listening at" not in res.output


def test_serve_speculative_ngram_same_greedy_text_opt_out_and_metrics(tmp_path, default_artifact):
    """--speculative ngram over a recipe without it: the start line prints the measured verify
    cost; a greedy chat answers the same text with speculation and with "speculative": false, and
    /metrics counts the verifies (only the speculating request's)."""
    doc = "The quay at Lancaster was a busy port. The quay at Lancaster had ships from the West Indies. " * 3
    with ServerProcess(
        default_artifact, "--speculative", "ngram", "--speculative-max-k", "3", "--speculative-ngram", "1", "3"
    ) as s:
        assert "speculative: ngram, up to 3 tokens per step, n-grams 1..3; measured cost of a verify" in "".join(
            s.lines
        )
        texts, drafts = [], []
        for opt_in in (False, True):
            r = httpx.post(
                s.url + "/v1/chat/completions",
                timeout=120,
                json={
                    "model": "smollm2-135m-cpu",
                    "max_tokens": 32,
                    "temperature": 0,
                    "speculative": opt_in,
                    "messages": [{"role": "user", "content": f"Repeat this text exactly.\n\n{doc}"}],
                },
            )
            assert r.status_code == 200, r.text
            texts.append(r.json()["choices"][0]["message"]["content"])
            drafts.append(s.metrics().get("trtpipe:spec_decode_num_drafts_total", 0.0))
        assert texts[0] == texts[1]
        assert drafts[0] == 0  # the opted-out request never verified
        # The sizing verifies only what pays at the measured cost: at the prior acceptance (0.5) a
        # 1-token proposal pays when a 2-token verify costs under 1.5 / 1.02 = 1.47 decode steps
        # (runtime/speculative/sizing.py); a noisy start can measure more, and then nothing is verified.
        two = float(re.search(r"decode step: 1: [0-9.]+x, 2: ([0-9.]+)x", "".join(s.lines)).group(1))
        if two >= 1.47:
            pytest.skip(f"the verify cost measured at start ({two}x a decode step for 2 tokens) does not pay")
        assert drafts[1] > 0
        m = s.metrics()
        assert 0 < m["trtpipe:spec_decode_num_accepted_tokens_total"] <= m["trtpipe:spec_decode_num_draft_tokens_total"]
        assert m["trtpipe:spec_decode_acceptance_length_count"] == drafts[1]


def test_speculative_flags_over_the_recipes_settings():
    from trtpipe.pipeline.cli.serve import _speculative
    from trtpipe.plugins.core.errors import TrtpipeError
    from trtpipe.runtime.speculative.config import SpeculativeConfig

    base = SpeculativeConfig(max_k=6, min_n=3, max_n=5)
    assert _speculative(base, None, 2, None) == SpeculativeConfig(max_k=2, min_n=3, max_n=5)
    assert _speculative(None, "ngram", None, (1, 2)) == SpeculativeConfig(max_k=4, min_n=1, max_n=2)
    assert _speculative(base, "off", None, None) is None
    with pytest.raises(TrtpipeError, match="speculative off"):
        _speculative(base, "off", 3, None, fail_now=False)
    with pytest.raises(TrtpipeError, match="speculative.min_n"):
        _speculative(None, "ngram", None, (4, 2), fail_now=False)
