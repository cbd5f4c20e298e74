"""One engine step: schedule -> prefill and decode engines -> sample -> scheduler update -> text.

    Scheduler.schedule() ──► SchedulerStep ─┬─ prefill chunks ──► engine.prefill ──► logits of last chunks
                                            └─ decodes ─────────► engine.decode ───► logits [S, V]
    sample (per request: its params and generator) ──► Scheduler.update (EOS, lengths, KV blocks)
    ──► incremental detokenizer (stop strings) ──► finished RequestOutputs

Where the engine allows it (``capabilities.fuses_mixed_steps``) a step with both is *one* prefill call, the
decodes as 1-token rows. A decode with proposed tokens (speculative decoding, :mod:`trtpipe.runtime.speculative`)
is a *verify* row: its token and the proposal run as one chunk of the prefill call with logits at
every position; :func:`~trtpipe.runtime.speculative.accept.verify` keeps the accepted prefix plus one token. Under the ``slo`` policy every step's predicted and measured time is
logged, and a mixed step re-plans the policy for this host's speed. Used by
:class:`~trtpipe.runtime.llm.LLM`, which owns what the runner steps over.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from trtpipe.runtime.engines.base import Engine
from trtpipe.runtime.metrics.request_metrics import StepStats
from trtpipe.runtime.sample.grammar import consume
from trtpipe.runtime.sample.logprobs import TokenLogprobs, gather, log_softmax
from trtpipe.runtime.sample.sampler import SampleRow, sample_rows
from trtpipe.runtime.sched.batch import DecodeBatch, PrefillBatch
from trtpipe.runtime.sched.request import Request, RequestStatus
from trtpipe.runtime.sched.request_output import LiveRequest, RequestOutput
from trtpipe.runtime.sched.scheduler import Scheduler
from trtpipe.runtime.sched.slo_policy import SloChunkPolicy
from trtpipe.runtime.sched.step import ScheduledDecode, ScheduledPrefill, SchedulerStep
from trtpipe.runtime.sched.step_cost import StepCostModel, StepSample
from trtpipe.runtime.speculative.accept import verify


class StepRunner:
    """Steps ``scheduler``'s requests through ``engine`` (an :class:`~trtpipe.runtime.engines.base.Engine`:
    ``prefill``, ``decode``, ``copy_blocks``, ``last_step_s``). ``live``: request id -> :class:`LiveRequest` (detokenizer,
    timer, generator, output), filled by the LLM as requests arrive. ``step_cost``: the LLM's
    step-cost model once measured (None before), for the slo policy's log. ``grammars``: the
    LLM's grammar compiler (masks of structured-output rows), called only when a row has a
    matcher. ``logprobs_mode``: "raw" or "processed" (:mod:`trtpipe.runtime.sample.logprobs`).
    ``grammar_time_s``: seconds spent filling grammar masks and advancing matchers."""

    def __init__(
        self,
        engine: Engine,
        scheduler: Scheduler,
        live: dict[str, LiveRequest],
        step_stats: StepStats,
        *,
        fuse_mixed_steps: bool,
        step_cost: Callable[[], StepCostModel | None],
        grammars: Callable[[], Any] | None = None,
        logprobs_mode: str = "raw",
    ):
        self.engine = engine
        self.scheduler = scheduler
        self.live = live
        self.step_stats = step_stats
        self.fuse_mixed_steps = fuse_mixed_steps
        self._step_cost = step_cost
        self.engine_time_s = 0.0
        self.steps = 0
        self.num_preemptions = 0
        self.step_cost_log: deque[StepSample] = deque(maxlen=100_000)
        self._grammars = grammars
        self.logprobs_mode = logprobs_mode
        self.grammar_time_s = 0.0
        self._logprobs: dict[str, Any] = {}  # this step's records (a tuple for a verify row), until _emit
        self._rejected: list[Request] = []  # finished this step: the grammar refused the token

    def step(self) -> list[RequestOutput]:
        """One scheduler step: prefill chunks + one decode batch. Returns finished outputs.

        ``schedule`` -> :meth:`_prefill` -> :meth:`_decode` -> ``update`` -> :meth:`_emit`; with
        ``fuse_mixed_steps`` a step with both is one :meth:`_prefill` call. An engine failure
        finishes the step's requests with an error (their KV blocks freed) and re-raises.
        """
        step = self.scheduler.schedule()
        copies = self.scheduler.kv_manager.take_pending_copies()  # copy-on-write of forked blocks
        if copies:
            self.engine.copy_blocks(copies)
        sampled: dict[str, int | tuple[int, ...]] = {}
        t_step = time.perf_counter()
        verifies = tuple(d for d in step.decodes if d.draft_token_ids)
        plain = tuple(d for d in step.decodes if not d.draft_token_ids)
        fused = self.fuse_mixed_steps and bool(step.prefills or verifies) and bool(plain)
        try:
            self._prefill(step.prefills, sampled, verifies + plain if fused else verifies)
            if not fused:
                self._decode(plain, sampled)
        except Exception as e:  # an engine failure finishes the step's requests, frees blocks
            for rid in {p.request_id for p in step.prefills} | {d.request_id for d in step.decodes}:
                self.scheduler.finish_request(rid, RequestStatus.FINISHED_ERROR, str(e))
            self.scheduler.update(step, {})
            raise
        finished = self.scheduler.update(step, sampled)
        finished.extend(self._rejected)
        self._rejected = []
        self.steps += 1
        self.num_preemptions += len(step.preempted)
        self._log_step_cost(step, time.perf_counter() - t_step)
        self.step_stats.on_step(
            time.monotonic(), decode_batch_size=len(step.decodes), kv_blocks_used=self.scheduler.kv_blocks_used
        )
        return self._emit(sampled, finished)

    def _prefill(
        self, prefills: Sequence[ScheduledPrefill], sampled: dict, decodes: Sequence[ScheduledDecode] = ()
    ) -> None:
        """Run the prefill engine on this step's chunks (and ``decodes`` as 1-token rows, a fused
        step, or verify chunks); sample the rows of last chunks and of the decodes into ``sampled``
        (request id -> token id; a verify row -> its tokens). Marks prefill start/end on the timers."""
        if not prefills and not decodes:
            return
        now = time.monotonic
        for p in prefills:
            live = self.live[p.request_id]
            if not live.prefill_started:
                live.timer.on_prefill_start(now())
                live.prefill_started = True
                cached = live.request.num_cached_tokens or 0
                live.timer.cached_prompt_tokens = live.output.cached_tokens = cached
        verifying = {d.request_id for d in decodes if d.draft_token_ids}
        batch = PrefillBatch.from_scheduled([*prefills, *(d.as_prefill_chunk() for d in decodes)], verifying)
        logits = self.engine.prefill(batch)  # [L, V] float32, rows in batch.request_ids order
        self.engine_time_s += self.engine.last_step_s
        if verifying:
            self._verify([d for d in decodes if d.draft_token_ids], batch, logits, sampled)
            at = [batch.logit_rows(i).stop - 1 for i in range(len(batch.request_ids))]  # last logits row
            logits = logits[at]  # [S, V]
        self._prompt_logprobs(prefills, batch.request_ids, logits)
        last = {p.request_id for p in prefills if p.is_last_chunk} | {d.request_id for d in decodes} - verifying
        rows = [i for i, rid in enumerate(batch.request_ids) if rid in last]
        if not rows:
            return
        rids = [batch.request_ids[i] for i in rows]
        forked = self._fork_rows(prefills, batch.request_ids, rows, rids)
        toks = self._sample(logits[rows], rids)
        t = now()
        ended = {p.request_id for p in prefills} | forked
        for rid, tok in zip(rids, toks):
            sampled[rid] = tok
            if rid in ended:
                self.live[rid].timer.on_prefill_end(t)

    def _verify(
        self, decodes: Sequence[ScheduledDecode], batch: PrefillBatch, logits: np.ndarray, sampled: dict
    ) -> None:
        """Accept a prefix of each verify row's proposal (:func:`~trtpipe.runtime.speculative.accept.verify`)
        from its ``k + 1`` logits rows; ``sampled[rid]`` = the tokens it emits."""
        speculator = self.scheduler.speculator
        for d in decodes:
            live = self.live[d.request_id]
            q = live.request
            rows = logits[batch.logit_rows(batch.request_ids.index(d.request_id))]  # [k + 1, V]
            row = SampleRow(q.sampling_params, live.rng, q.prompt_token_ids, q.output_token_ids)
            eos = self.scheduler.eos_token_ids
            got = verify(rows, d.draft_token_ids, row, eos_token_ids=eos, logprobs_mode=self.logprobs_mode)
            sampled[d.request_id] = got.token_ids
            if q.sampling_params.logprobs is not None:
                self._logprobs[d.request_id] = got.logprobs
            if speculator is not None:
                speculator.on_verified(d.request_id, len(d.draft_token_ids), got.num_accepted)

    def _prompt_logprobs(self, prefills: Sequence[ScheduledPrefill], batch_ids: Sequence[str], logits: Any) -> None:
        """Requests that asked ``prompt_logprobs`` prefill one token per step (``chunk_cap``): the
        chunk at position p gives the raw logprobs of prompt token p + 1 (entry p + 1 of
        ``output.prompt_logprobs``; entry 0, the first token, is None as in OpenAI's echo)."""
        for p in prefills:
            live = self.live[p.request_id]
            want, lps = live.request.sampling_params.prompt_logprobs, live.output.prompt_logprobs
            prompt, nxt = live.request.prompt_token_ids, p.context_len
            if want is None or lps is None or nxt >= len(prompt) or len(lps) != nxt:
                continue  # (a recompute after preemption finds its entries there already)
            row = log_softmax(np.asarray(logits[batch_ids.index(p.request_id)], np.float32)[None])
            lps.append(gather(row, np.array([prompt[nxt]]), [want])[0])

    def _fork_rows(
        self, prefills: Sequence[ScheduledPrefill], batch_ids: Sequence[str], rows: list[int], rids: list[str]
    ) -> set[str]:
        """n > 1: the choices that fork a prefill finishing its prompt now sample their first token
        from its logits row (appended to ``rows`` / ``rids``); their timers mark the prefill."""
        forked = set()
        for p in prefills:
            for child in self.scheduler.fork_candidates(p):
                rows.append(batch_ids.index(p.request_id))
                rids.append(child.request_id)
                live = self.live[child.request_id]
                live.timer.on_prefill_start(time.monotonic())
                live.prefill_started = True
                forked.add(child.request_id)
        return forked

    def _decode(self, decodes: tuple[ScheduledDecode, ...], sampled: dict[str, int | tuple[int, ...]]) -> None:
        """Run the decode engine once for every decoding sequence (one token each); sample into
        ``sampled``."""
        if not decodes:
            return
        batch = DecodeBatch.from_scheduled(decodes)
        logits = self.engine.decode(batch)  # [S, V] float32
        self.engine_time_s += self.engine.last_step_s
        rids = list(batch.request_ids)
        for rid, tok in zip(rids, self._sample(logits, rids)):
            sampled[rid] = tok

    def _log_step_cost(self, step: SchedulerStep, measured_s: float) -> None:
        """Under the slo policy: record (predicted, measured) step time for the reports."""
        cost = self._step_cost()
        if self.scheduler.chunk_policy is None or cost is None or step.is_empty:
            return
        predicted = cost.predict_step_s(step)
        policy, prefill_tokens = self.scheduler.chunk_policy, sum(p.num_tokens for p in step.prefills)
        factor = getattr(policy, "host_factor", 1.0)  # (what the step was planned with)
        self.step_cost_log.append(StepSample(predicted, measured_s, prefill_tokens, len(step.decodes), factor))
        if isinstance(policy, SloChunkPolicy) and prefill_tokens and step.decodes:  # a mixed step: re-plan
            self.scheduler.chunk_policy = policy.tracking_host(self.step_cost_log)

    def _emit(self, sampled: dict[str, int | tuple[int, ...]], finished: list[Request]) -> list[RequestOutput]:
        """Detokenize the sampled tokens into the outputs (stop strings finish requests), then
        close the finished ones; returns their outputs."""
        t = time.monotonic()
        for rid, got in sampled.items():
            live = self.live.get(rid)
            if live is None:
                continue
            rec = self._logprobs.pop(rid, None)
            if isinstance(got, tuple):  # a verify row: the tokens the scheduler kept (it stops at EOS)
                toks = got[: len(live.request.output_token_ids) - len(live.output.output_token_ids)]
                recs = tuple(rec) if rec is not None else (None,) * len(toks)
            else:
                toks, recs = (got,), (rec,)
            for tok, lp in zip(toks, recs):
                if self._emit_token(live, tok, lp, t):
                    self.scheduler.finish_request(rid, RequestStatus.FINISHED_STOPPED)
                    finished.append(live.request)
                    break
        done = []
        for req in finished:
            live = self.live.pop(req.request_id, None)
            if live is None:
                continue
            live.append_text(live.detok.flush(), final=True)
            live.finish(req.finish_reason or "stop", req.error_message)
            done.append(live.output)
        return done

    @staticmethod
    def _emit_token(live: LiveRequest, tok: int, rec: TokenLogprobs | None, t: float) -> bool:
        """One token into ``live``'s output and timer; True when a stop string ends the request."""
        piece = live.detok.add(tok)
        live.output.output_token_ids.append(tok)
        if rec is not None and live.output.logprobs is not None:
            live.output.logprobs.append(rec)
        live.timer.on_tokens(t, 1, piece)
        live.request.itl_sum_s = t - live.timer.token_times_s[0]  # the slo policy's TPOT so far
        return live.append_text(piece)

    def _sample(self, logits: np.ndarray, rids: list[str]) -> list[int]:
        """Sample ``[S, V]`` logits for ``rids`` (:func:`sample_rows`): grammar masks for rows with
        a matcher, then advance those matchers; keeps logprob records for :meth:`_emit`."""
        reqs = [self.live[r].request for r in rids]
        rows = [
            SampleRow(q.sampling_params, self.live[q.request_id].rng, q.prompt_token_ids, q.output_token_ids)
            for q in reqs
        ]
        constrained = [i for i, q in enumerate(reqs) if q.grammar is not None]
        bitmask = None
        t0 = time.perf_counter()
        if constrained and self._grammars is not None:
            bitmask = self._grammars().fill_bitmask([reqs[i].grammar for i in constrained], constrained, len(rids))
        self.grammar_time_s += time.perf_counter() - t0
        toks, lps = sample_rows(
            np.asarray(logits, np.float32),
            rows,
            eos_token_ids=self.scheduler.eos_token_ids,
            bitmask=bitmask,
            constrained=np.asarray(constrained, np.int64),
            logprobs_mode=self.logprobs_mode,
        )
        t0 = time.perf_counter()
        for i in constrained:
            error = consume(reqs[i].grammar, int(toks[i]))
            if error is not None:  # only a contradicting min_tokens/grammar row gets here
                rid = rids[i]
                done = self.scheduler.finish_request(rid, RequestStatus.FINISHED_ERROR, f"structured output: {error}")
                if done is not None:
                    self._rejected.append(done)
        self.grammar_time_s += time.perf_counter() - t0
        for rid, rec in zip(rids, lps):
            if rec is not None:
                self._logprobs[rid] = rec
        return [int(x) for x in toks]


__all__ = ["StepRunner"]
