"""The native engine's step boundary: the arrays of one step checked once before C reads them.

Two halves, so the check costs nothing per step that C does not already do:

* :func:`step_arrays` (every step): each array is an integer NumPy array of the length the
  step's T (tokens) and S (sequences) say - ``input_ids``, ``positions``, ``slot_mapping`` [T];
  ``context_lens``, ``last_token_indices`` [S]; ``query_start_loc`` [S + 1]; ``block_tables``
  [S, MB] - made C-contiguous int64. C cannot know an array's length: this half is what keeps it
  inside its buffers.
* tp_forward (C, csrc/forward.c ``check_step``) checks every value that becomes an address
  before anything is read or written, and returns a code. Only then :func:`explain_step`
  (NumPy, error path only) finds the field, the value and what was expected.

A refused step leaves the KV pool and every other request as they were: nothing was written.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trtpipe.runtime.errors import StepError

FIELDS_T = ("input_ids", "positions", "slot_mapping")
FIELDS_S = ("context_lens", "last_token_indices")


@dataclass(frozen=True)
class StepLimits:
    """What a step's values must stay below: ``vocab_size`` (input ids), ``max_positions``
    (positions and context lengths), ``num_blocks`` and ``block_size`` (block ids, slots)."""

    vocab_size: int
    max_positions: int
    num_blocks: int
    block_size: int


def _refuse(field: str, value: object, expected: str) -> StepError:
    return StepError(
        f"native engine: step field {field} = {value}: expected {expected}. The step was refused before "
        "anything was read or written (the KV pool and other requests are unchanged). Fix: this is a bug "
        "in whatever built the batch (the scheduler, or a direct engine call): report it with this message.",
        field=field,
    )


def _as_int64(field: str, v: object) -> np.ndarray:
    a = np.asarray(v)
    if a.dtype.kind not in "iu":
        raise _refuse(field, f"an array of {a.dtype}", "integers (int64)")
    return np.ascontiguousarray(a, np.int64)


def step_arrays(feeds: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int, int, int]:
    """``(arrays, T, S, MB)``: the feeds as C-contiguous int64, lengths checked against T and S.
    Raises :class:`StepError` naming the field for a missing array, a non-integer dtype or a
    length or rank that does not match."""
    missing = [k for k in (*FIELDS_T, *FIELDS_S, "query_start_loc", "block_tables") if k not in feeds]
    if missing:
        raise _refuse(missing[0], "missing", "every array of a step (docs/contracts.md)")
    a = {k: _as_int64(k, v) for k, v in feeds.items()}
    T, S = a["input_ids"].size, a["context_lens"].size
    for k in FIELDS_T:
        if a[k].ndim != 1 or a[k].size != T:
            raise _refuse(k, f"shape {a[k].shape}", f"[T] = [{T}] (one per token)")
    for k in FIELDS_S:
        if a[k].ndim != 1 or a[k].size != S:
            raise _refuse(k, f"shape {a[k].shape}", f"[S] = [{S}] (one per sequence)")
    if a["query_start_loc"].shape != (S + 1,):
        raise _refuse("query_start_loc", f"shape {a['query_start_loc'].shape}", f"[S + 1] = [{S + 1}]")
    bt = a["block_tables"]
    if bt.ndim != 2 or bt.shape[0] != S or bt.shape[1] < 1:
        raise _refuse("block_tables", f"shape {bt.shape}", f"[S, MB] = [{S}, >= 1]")
    if T < 1:
        raise _refuse("input_ids", "an empty array", "at least one token")
    return a, T, S, bt.shape[1]


def step_arrays_rows(logit_indices: object) -> np.ndarray:
    """A verify step's ``logit_indices`` [L] as C-contiguous int64 (values are checked by C)."""
    rows = _as_int64("logit_indices", logit_indices)
    if rows.ndim != 1:
        raise _refuse("logit_indices", f"shape {rows.shape}", "[L] (one row index per logits row)")
    return rows


def _first_outside(field: str, v: np.ndarray, lo: int, hi: int, what: str) -> StepError | None:
    bad = np.flatnonzero((v < lo) | (v >= hi))
    if bad.size:
        return _refuse(f"{field}[{bad[0]}]", int(v[bad[0]]), f"{what} in [{lo}, {hi})")
    return None


def _explain_rows(a: dict[str, np.ndarray], T: int, S: int, lim: StepLimits) -> StepError | None:
    """The query_start_loc, context_lens and block_tables faults (the per-sequence values)."""
    qsl, ctx, bt = a["query_start_loc"], a["context_lens"], a["block_tables"]
    if qsl[0] != 0 or qsl[-1] != T or (np.diff(qsl) < 1).any():
        return _refuse("query_start_loc", qsl.tolist()[:8], f"0 = q[0] < q[1] < ... < q[S] = T = {T}")
    for s in range(S):
        n = int(qsl[s + 1] - qsl[s])
        if not n <= ctx[s] <= lim.max_positions:
            return _refuse(f"context_lens[{s}]", int(ctx[s]), f"{n} (its query tokens) to {lim.max_positions}")
        need = -(-int(ctx[s]) // lim.block_size)
        if need > bt.shape[1]:
            cap = bt.shape[1] * lim.block_size
            return _refuse(f"context_lens[{s}]", int(ctx[s]), f"<= {cap} (its block table's {bt.shape[1]} blocks)")
        err = _first_outside(f"block_tables[{s}]", bt[s, :need], 0, lim.num_blocks, "block ids")
        if err:
            return err
    return None


def explain_step(a: dict[str, np.ndarray], T: int, S: int, lim: StepLimits, levels: tuple[int, ...]) -> StepError:
    """The first field of a step C refused, with its value and what was expected (NumPy; called
    only after tp_forward returned an error code)."""
    checks = (
        ("input_ids", 0, lim.vocab_size, "token ids"),
        ("positions", 0, lim.max_positions, "positions"),
        ("slot_mapping", 0, lim.num_blocks * lim.block_size, "slots of the pool"),
    )
    for field, lo, hi, what in checks:
        err = _first_outside(field, a[field], lo, hi, what)
        if err:
            return err
    err = _explain_rows(a, T, S, lim)
    if err:
        return err
    if any(lv not in (1, 2) for lv in levels):
        return _refuse("activation levels", list(levels), "1 or 2 at each site")
    rows = "logit_indices" if "logit_indices" in a else "last_token_indices"
    return _first_outside(rows, a[rows], 0, T, "rows of the step's tokens") or _refuse(rows, "?", f"rows in [0, {T})")
