"""The host key of cached measurements: host name + CPU (family/model/SIMD flags), so a
step_cost.json measured on another CPU behind the same host name is measured again."""

from __future__ import annotations

import platform

from trtpipe.runtime.artifact.host_cpu import cpu_identity, host_id
from trtpipe.runtime.core import calibrate as step_cost
from trtpipe.runtime.core.calibrate import load_or_calibrate
from trtpipe.runtime.engines.base import EngineCapabilities
from trtpipe.runtime.sched.step_cost import STEP_COST_FILE, StepCostModel

ZEN3 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC
flags\t\t: fpu sse4_1 sse4_2 avx fma avx2 sse4a

processor\t: 1
vendor_id\t: GenuineIntel
cpu family\t: 6
"""
ZEN4_FLAGS = "fpu avx2 fma avx512f avx512bw avx512_vnni avx512_bf16"


class _Engine:
    """Only the capabilities: ``calibrate`` is replaced in these tests."""

    capabilities = EngineCapabilities("", False, False, False, ())


ENGINE = _Engine()


def test_cpu_identity_names_family_model_and_simd_flags():
    assert cpu_identity(ZEN3) == "AuthenticAMD family 25 model 1 [avx2 fma]"
    zen4 = ZEN3.replace("model\t\t: 1", "model\t\t: 17").replace(
        "flags\t\t: fpu sse4_1 sse4_2 avx fma avx2 sse4a", "flags\t\t: " + ZEN4_FLAGS
    )
    assert cpu_identity(zen4) == "AuthenticAMD family 25 model 17 [avx2 fma avx512f avx512bw avx512_vnni avx512_bf16]"
    assert host_id().startswith(platform.node() + " / ")


def test_step_cost_from_another_cpu_is_measured_again(tmp_path, monkeypatch):
    measured = StepCostModel(prefill_s=(0.01, 0.002, 0.0), decode_s=(0.01, 0.001, 0.0), host=host_id())
    calls = []
    monkeypatch.setattr(step_cost, "calibrate", lambda *a, **k: calls.append(1) or measured)
    old = StepCostModel(prefill_s=(1.0, 1.0, 0.0), decode_s=(1.0, 1.0, 0.0), host=platform.node())  # name only
    (tmp_path / STEP_COST_FILE).write_text(old.to_json())
    got = load_or_calibrate(tmp_path, ENGINE, None, 16, 512, 8, None)
    assert calls == [1] and got.prefill_s == measured.prefill_s
    # written back with this host's key, then reused without measuring
    assert StepCostModel.from_json((tmp_path / STEP_COST_FILE).read_text()).host == host_id()
    assert load_or_calibrate(tmp_path, ENGINE, None, 16, 512, 8, None).prefill_s == measured.prefill_s
    assert calls == [1]


def _model(rel_error: float, p1: float) -> StepCostModel:
    return StepCostModel(
        prefill_s=(0.01, p1, 0.0), decode_s=(0.01, 0.001, 0.0), rel_error=rel_error, host=host_id(), calibration_s=4.0
    )


def _calibrations(monkeypatch, models: list[StepCostModel]) -> list[int]:
    calls: list[int] = []

    def calibrate(*_a, **_k) -> StepCostModel:
        calls.append(1)
        return models[len(calls) - 1]

    monkeypatch.setattr(step_cost, "calibrate", calibrate)
    return calls


def test_noisy_calibration_is_repeated_and_the_best_fit_kept(tmp_path, monkeypatch):
    # errors 77 %, 60 %, 40 % (the first is what a busy start measured): three calibrations, the
    # 40 % fit is used and stored (<= MAX_STORED_REL_ERROR), its time the sum of the three
    calls = _calibrations(monkeypatch, [_model(0.77, 0.001), _model(0.60, 0.002), _model(0.40, 0.003)])
    logs: list[str] = []
    got = load_or_calibrate(tmp_path, ENGINE, None, 16, 512, 8, None, log=logs.append)
    assert len(calls) == step_cost.CALIBRATION_ATTEMPTS == 3
    assert (got.prefill_s[1], got.rel_error, got.calibration_s) == (0.003, 0.40, 12.0)
    assert "best of 3 calibrations (errors 77%, 60%, 40%)" in logs[0]
    assert StepCostModel.from_json((tmp_path / STEP_COST_FILE).read_text()).prefill_s[1] == 0.003


def test_good_calibration_runs_once_and_bad_stored_file_is_measured_again(tmp_path, monkeypatch):
    # a stored fit off by 77 % (kept by the older 100 % bound) is not reused
    (tmp_path / STEP_COST_FILE).write_text(_model(0.77, 0.009).to_json())
    calls = _calibrations(monkeypatch, [_model(0.18, 0.001)])
    got = load_or_calibrate(tmp_path, ENGINE, None, 16, 512, 8, None)
    assert len(calls) == 1 and got.prefill_s[1] == 0.001 and got.calibration_s == 4.0
    assert StepCostModel.from_json((tmp_path / STEP_COST_FILE).read_text()).rel_error == 0.18


def test_calibration_still_noisy_after_every_attempt_is_used_not_stored(tmp_path, monkeypatch):
    calls = _calibrations(monkeypatch, [_model(0.9, 0.001), _model(0.6, 0.002), _model(0.7, 0.003)])
    got = load_or_calibrate(tmp_path, ENGINE, None, 16, 512, 8, None)
    assert len(calls) == 3 and got.rel_error == 0.6 and got.prefill_s[1] == 0.002
    assert not (tmp_path / STEP_COST_FILE).exists()


def test_calibration_stops_at_the_first_good_fit(tmp_path, monkeypatch):
    calls = _calibrations(monkeypatch, [_model(0.77, 0.001), _model(0.20, 0.002), _model(0.10, 0.003)])
    got = load_or_calibrate(tmp_path, ENGINE, None, 16, 512, 8, None)
    assert len(calls) == 2 and got.prefill_s[1] == 0.002 and got.calibration_s == 8.0
    # a stored fit between the retry and the storing bounds (0.35 < 0.4 <= 0.5) is reused as it is
    (tmp_path / STEP_COST_FILE).write_text(_model(0.40, 0.005).to_json())
    assert load_or_calibrate(tmp_path, ENGINE, None, 16, 512, 8, None).prefill_s[1] == 0.005 and len(calls) == 2
