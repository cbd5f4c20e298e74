"""Engine input records built from a scheduler step (docs/contracts.md "Graph I/O").

All index arrays are int64. Block-table rows are padded with 0 (the null block) to the longest
row of the batch; the attention mask, not the padding, decides what is read, so a padded row
never reads another sequence's blocks.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from trtpipe.runtime.sched.step import ScheduledDecode, ScheduledPrefill


def _block_tables(rows: Sequence[Sequence[int]]) -> np.ndarray:
    mb = max(1, max(len(r) for r in rows))
    bt = np.zeros((len(rows), mb), np.int64)
    for i, r in enumerate(rows):
        bt[i, : len(r)] = r
    return bt


@dataclass(frozen=True)
class PrefillBatch:
    """A packed ragged batch of prompt chunks (no padding tokens).

    input_ids, positions, slot_mapping: [T]; block_tables: [S, MB]; context_lens: [S];
    query_start_loc: [S+1]; last_token_indices: [S]; request_ids: S ids in row order.
    ``logit_indices`` [L] (None: ``last_token_indices``): the packed tokens whose logits the engine
    returns, row by row; ``logit_start_loc`` [S+1]: row s's logits are ``logits[lsl[s]:lsl[s+1]]``.
    Rows named in ``from_scheduled(all_logits=...)`` (speculative verify chunks) get every
    position's logits, the others their last token's, so a batch without verify rows is unchanged.

    Row order: :meth:`from_scheduled` puts rows of one token (decode tokens riding in a prefill
    call) after the longer chunks, keeping each group's order: the ONNX Runtime prefill graph
    runs trailing 1-token rows through its decode attention path instead of padding them to the
    longest chunk (``trtpipe.plugins.ops.paged_attention.lower_onnx``, 3.). The logits' rows follow
    ``request_ids``, so callers map rows by id, not by the order they passed.
    """

    request_ids: tuple[str, ...]
    input_ids: np.ndarray
    positions: np.ndarray
    slot_mapping: np.ndarray
    block_tables: np.ndarray
    context_lens: np.ndarray
    query_start_loc: np.ndarray
    last_token_indices: np.ndarray
    logit_indices: np.ndarray | None = None
    logit_start_loc: np.ndarray | None = None

    @classmethod
    def from_scheduled(cls, prefills: Sequence[ScheduledPrefill], all_logits: Collection[str] = ()) -> PrefillBatch:
        prefills = [p for p in prefills if p.num_tokens != 1] + [p for p in prefills if p.num_tokens == 1]
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        lens: list[int] = []
        for p in prefills:
            n = len(p.token_ids)
            ids.extend(p.token_ids)
            pos.extend(range(p.start_position, p.start_position + n))
            slots.extend(p.slot_mapping)
            lens.append(n)
        qsl = np.zeros(len(prefills) + 1, np.int64)
        qsl[1:] = np.cumsum(lens)
        logit_indices = lsl = None
        if all_logits:
            every = [p.request_id in all_logits for p in prefills]
            logit_indices = np.concatenate(
                [np.arange(qsl[i], qsl[i + 1]) if e else qsl[i + 1 : i + 2] - 1 for i, e in enumerate(every)]
            ).astype(np.int64)
            lsl = np.zeros(len(prefills) + 1, np.int64)
            lsl[1:] = np.cumsum([n if e else 1 for n, e in zip(lens, every)])
        return cls(
            request_ids=tuple(p.request_id for p in prefills),
            input_ids=np.asarray(ids, np.int64),
            positions=np.asarray(pos, np.int64),
            slot_mapping=np.asarray(slots, np.int64),
            block_tables=_block_tables([p.block_table for p in prefills]),
            context_lens=np.asarray([p.start_position + len(p.token_ids) for p in prefills], np.int64),
            query_start_loc=qsl,
            last_token_indices=qsl[1:] - 1,
            logit_indices=logit_indices,
            logit_start_loc=lsl,
        )

    def logit_rows(self, row: int) -> slice:
        """The logits rows of batch row ``row`` (one, or every position of a verify chunk)."""
        if self.logit_start_loc is None:
            return slice(row, row + 1)
        return slice(int(self.logit_start_loc[row]), int(self.logit_start_loc[row + 1]))

    def feeds(self) -> dict[str, np.ndarray]:
        return {
            "input_ids": self.input_ids,
            "positions": self.positions,
            "slot_mapping": self.slot_mapping,
            "block_tables": self.block_tables,
            "context_lens": self.context_lens,
            "query_start_loc": self.query_start_loc,
            "last_token_indices": self.last_token_indices,
        }


@dataclass(frozen=True)
class DecodeBatch:
    """One token per running sequence. All arrays [S] except block_tables [S, MB]."""

    request_ids: tuple[str, ...]
    input_ids: np.ndarray
    positions: np.ndarray
    slot_mapping: np.ndarray
    block_tables: np.ndarray
    context_lens: np.ndarray

    @classmethod
    def from_scheduled(cls, decodes: Sequence[ScheduledDecode]) -> DecodeBatch:
        return cls(
            request_ids=tuple(d.request_id for d in decodes),
            input_ids=np.asarray([d.token_id for d in decodes], np.int64),
            positions=np.asarray([d.position for d in decodes], np.int64),
            slot_mapping=np.asarray([d.slot for d in decodes], np.int64),
            block_tables=_block_tables([d.block_table for d in decodes]),
            context_lens=np.asarray([d.position + 1 for d in decodes], np.int64),
        )

    def feeds(self) -> dict[str, np.ndarray]:
        return {
            "input_ids": self.input_ids,
            "positions": self.positions,
            "slot_mapping": self.slot_mapping,
            "block_tables": self.block_tables,
            "context_lens": self.context_lens,
        }
