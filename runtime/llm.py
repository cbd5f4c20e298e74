"""``LLM``: the user-facing runtime object (vLLM's ``LLM`` / ``LLMEngine`` shape, trimmed).

    llm = LLM("artifacts/smollm2-135m-cpu/cpu")
    out = llm.generate(["What is the capital of France?"], SamplingParams(max_new_tokens=32), chat=True)
    for piece in llm.stream("Tell me a joke", chat=True): print(piece, end="")

Each :meth:`step` runs the prefill engine once for the scheduled prompt chunks and the decode
engine once for all running sequences (continuous batching), samples, updates the scheduler, and
turns new tokens into text with an incremental detokenizer; where the engine allows it
(``fuses_mixed_steps``) a step with both is *one* prefill call, decodes as 1-token rows. Token
ids and text are kept apart. Timings per request come from :mod:`trtpipe.runtime.metrics.request_metrics` on
the monotonic clock.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from trtpipe.runtime.artifact.chat_template import encode_prompt
from trtpipe.runtime.artifact.detokenizer import IncrementalDetokenizer
from trtpipe.runtime.artifact.manifest import Manifest, load_manifest
from trtpipe.runtime.artifact.tokenizer import Tokenizer
from trtpipe.runtime.errors import RequestError
from trtpipe.runtime.kv.block_pool import BlockPool
from trtpipe.runtime.kv.cache_manager import KVCacheManager
from trtpipe.runtime.kv.pool import KVPool
from trtpipe.runtime.metrics.request_metrics import RequestTimer, StepStats
from trtpipe.runtime.sample.sampler import make_generator, sample
from trtpipe.runtime.sched.batch import DecodeBatch, PrefillBatch
from trtpipe.runtime.sched.request import Request, RequestStatus, SamplingParams, prompt_length_error, require_bools
from trtpipe.runtime.sched.request_output import LiveRequest, RequestOutput
from trtpipe.runtime.sched.scheduler import Scheduler
from trtpipe.runtime.sched.slo_policy import SloChunkPolicy, check_budget_ms, fcfs_description
from trtpipe.runtime.sched.step import ScheduledDecode, ScheduledPrefill, SchedulerStep
from trtpipe.runtime.sched.step_cost import StepCostModel, StepSample, load_or_calibrate

if TYPE_CHECKING:  # engines import their backends (onnxruntime, tensorrt) when constructed
    from trtpipe.runtime.engines.ort import OrtEngine
    from trtpipe.runtime.engines.trt import TrtEngine


class LLM:
    """Prefill + decode engines over one paged KV pool, with a continuous-batching scheduler.

    Args:
        artifact_dir: a built artifact (``trtpipe build``); read through its manifest only.
        num_threads: ONNX Runtime intra-op threads (None: the artifact's setting or ORT's default).
        prefix_caching: reuse the KV of earlier requests' identical prompt prefixes (automatic
            prefix caching, on by default: outputs are the same as without it; the recipe's
            ``kv_cache.prefix_caching`` sets it in ``trtpipe validate``).
        scheduler_policy: ``slo`` (size prefill chunks so steps stay within ``tpot_budget_ms``,
            see :mod:`trtpipe.runtime.sched.slo_policy`) or ``fcfs``; ``slo`` without a budget is FCFS.
        tpot_budget_ms, itl_budget_ms: the ``slo`` policy's budgets (None = none; change them with
            :meth:`set_tpot_budget`); setting one measures the engine's step-cost model once.
        fuse_mixed_steps: a step's prompt chunks and decodes in one engine call where it can; False = two.

    ``prefix_cache_queries`` / ``prefix_cache_hits``: prompt tokens looked up in / found in the
    prefix cache since load (counters for ``trtpipe:prefix_cache_queries`` / ``_hits``).

    Raises :class:`ArtifactError` for a missing/corrupted/mismatched artifact; :class:`RequestError` for bad arguments.
    """

    def __init__(
        self,
        artifact_dir: str | Path,
        num_threads: int | None = None,
        step_stats: StepStats | None = None,
        *,
        prefix_caching: bool = True,
        scheduler_policy: str = "slo",
        tpot_budget_ms: float | None = None,
        itl_budget_ms: float | None = None,
        fuse_mixed_steps: bool = True,
    ):
        require_bools(prefix_caching=prefix_caching, fuse_mixed_steps=fuse_mixed_steps)
        self.manifest: Manifest = load_manifest(artifact_dir)
        m = self.manifest
        self.tokenizer = Tokenizer.from_file(
            m.path(m.tokenizer_file),
            bos_token_id=m.model.bos_token_id,
            eos_token_id=(m.model.eos_token_ids or (None,))[0],
        )
        self.pool = KVPool(m.kv)
        self.engine: OrtEngine | TrtEngine
        if m.options.backend == "ort":
            from trtpipe.runtime.engines.ort import OrtEngine

            self.engine = OrtEngine(m, self.pool, num_threads=num_threads)
        else:
            from trtpipe.runtime.engines.trt import TrtEngine

            self.engine = TrtEngine(m, self.pool)
        self.block_pool = BlockPool(m.kv.num_blocks)
        self.kv_manager = KVCacheManager(self.block_pool, m.kv.block_size, m.kv.sliding_window)
        # The artifact's identity in every block hash: its build hash and its inputs (weights).
        build_id = f"{(m.build_info or {}).get('build_hash') or m.recipe_hash}:{m.inputs_hash}"
        self.scheduler = Scheduler(
            self.kv_manager,
            m.limits["max_num_tokens"],
            m.limits["max_batch_size"],
            m.limits["max_seq_len"],
            eos_token_ids=m.model.eos_token_ids,
            enable_prefix_caching=prefix_caching,
            build_hash=build_id,
        )
        self.step_stats = step_stats or StepStats(num_kv_blocks=m.kv.num_blocks - 1)
        self._live: dict[str, LiveRequest] = {}
        self._ids = itertools.count()
        self.engine_time_s = 0.0
        self.steps = 0
        self.num_preemptions = 0  # requests preempted (KV freed, recomputed later), all steps
        if scheduler_policy not in ("slo", "fcfs"):
            raise RequestError(f"scheduler_policy = {scheduler_policy!r}: expected 'slo' or 'fcfs'")
        self.scheduler_policy = scheduler_policy
        self.fuse_mixed_steps = bool(fuse_mixed_steps and getattr(self.engine, "fuses_mixed_steps", False))
        self.num_threads = num_threads
        self.step_cost: StepCostModel | None = None
        self.step_cost_log: deque[StepSample] = deque(maxlen=100_000)
        self.set_tpot_budget(tpot_budget_ms, itl_budget_ms)

    def set_tpot_budget(self, tpot_budget_ms: float | None, itl_budget_ms: float | None = None) -> str:
        """Apply the scheduler policy for ``tpot_budget_ms`` (None: the ITL budget, else FCFS) and
        ``itl_budget_ms`` (None: every step within the TPOT budget; see slo_policy); between steps.

        Returns one line saying which prefill chunk sizes that gives, and why (for reports); it
        says so when ``itl_budget_ms`` is not used (policy fcfs). Raises
        :class:`TrtpipeError` for a budget that is not a finite number of ms > 0.
        """
        for name, value in (("tpot_budget_ms", tpot_budget_ms), ("itl_budget_ms", itl_budget_ms)):
            if value is not None:
                check_budget_ms(name, value)  # before the step-cost model is measured
        limit = self.manifest.limits["max_num_tokens"]
        tpot_budget_ms = itl_budget_ms if tpot_budget_ms is None else tpot_budget_ms  # TPOT <= every ITL
        if self.scheduler_policy == "fcfs" or tpot_budget_ms is None:
            self.scheduler.chunk_policy = None
            why = "policy fcfs" if self.scheduler_policy == "fcfs" else "slo policy without a TPOT budget"
            return fcfs_description(why, limit, itl_budget_ms)
        cost, block_size = self.step_cost_model(), self.kv_manager.block_size
        policy = SloChunkPolicy(cost, float(tpot_budget_ms), block_size, limit, itl_budget_ms)
        self.scheduler.chunk_policy = policy
        return policy.describe(self.manifest.limits["max_batch_size"], 256)

    def step_cost_model(self) -> StepCostModel:
        """The engine's step-cost model: the artifact's ``step_cost.json`` or measured now."""
        if self.step_cost is None:
            self.step_cost = load_or_calibrate(
                self.manifest.path("."),
                self.engine,
                self.block_pool,
                self.kv_manager.block_size,
                self.manifest.limits["max_num_tokens"],
                self.manifest.limits["max_batch_size"],
                self.num_threads,
                fused=self.fuse_mixed_steps,
            )
        return self.step_cost

    @property
    def prefix_cache_queries(self) -> int:
        """Prompt tokens looked up in the prefix cache since load (counter)."""
        return self.scheduler.prefix_cache_queries

    @property
    def prefix_cache_hits(self) -> int:
        """Prompt tokens found in the prefix cache since load (counter)."""
        return self.scheduler.prefix_cache_hits

    # -- requests ----------------------------------------------------------------------------
    def encode_prompt(self, prompt: str | bytes, chat: bool = False) -> list[int]:
        """Token ids of a prompt (chat template from the model metadata when ``chat``); see
        :func:`trtpipe.runtime.artifact.chat_template.encode_prompt`."""
        return encode_prompt(self.tokenizer, self.manifest.model.chat_template, prompt, chat)

    def encode_chat(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """Token ids of a conversation (``[{"role": "system"|"user"|"assistant", "content": ...}]``)
        under the model's chat template, ending with the assistant header (the model answers next).

        Raises :class:`RequestError` when the model has no chat template or the template rejects
        the conversation.
        """
        return encode_prompt(self.tokenizer, self.manifest.model.chat_template, messages, chat=True)

    def add_request(
        self,
        prompt: str | bytes | Sequence[int],
        params: SamplingParams | None = None,
        *,
        chat: bool = False,
        request_id: str | None = None,
        arrival_s: float | None = None,
        on_text: Callable[[str], None] | None = None,
        cache_salt: str | None = None,
    ) -> str:
        """Queue a request; returns its id. ``prompt`` is text or token ids.

        ``cache_salt``: only requests with the same salt share prefix-cache blocks (vLLM's
        ``cache_salt``; e.g. one per tenant). None = the common, unsalted cache.

        Raises :class:`RequestError` for an empty prompt, invalid UTF-8, bad sampling parameters,
        or a prompt longer than ``max_seq_len`` (the request is refused; nothing else is disturbed).
        """
        params = (params or SamplingParams()).validate()
        ids = self.encode_prompt(prompt, chat) if isinstance(prompt, (str, bytes)) else [int(t) for t in prompt]
        if not ids:
            raise RequestError("prompt_token_ids is empty. Fix: send a non-empty prompt.")
        too_long = prompt_length_error(len(ids), self.manifest.limits["max_seq_len"])
        if too_long is not None:
            raise RequestError(too_long)
        rid = request_id or f"req-{next(self._ids)}"
        arrival = time.monotonic() if arrival_s is None else arrival_s
        if cache_salt is not None and not isinstance(cache_salt, str):
            raise RequestError(f"cache_salt = {cache_salt!r}: expected a string or None. Fix: pass e.g. a tenant id.")
        req = Request(rid, tuple(ids), params, arrival_time_s=arrival, cache_salt=cache_salt)
        self.scheduler.add_request(req)
        out = RequestOutput(rid, tuple(ids))
        self._live[rid] = LiveRequest(
            req,
            IncrementalDetokenizer(self.tokenizer.backend, ids),
            RequestTimer(rid, prompt_tokens=len(ids), arrival_s=arrival),
            make_generator(params),
            out,
            on_text,
        )
        return rid

    def cancel(self, request_id: str) -> bool:
        """Cancel a request: its KV blocks are freed at once. False if unknown or finished."""
        req = self.scheduler.abort(request_id)
        live = self._live.pop(request_id, None)
        if live is not None:
            live.finish("abort")
        return req is not None

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def partial_output(self, request_id: str) -> RequestOutput | None:
        """The live (unfinished) output of a request, updated in place by every step; None once
        it finished or was cancelled (the finished one is what :meth:`step` returned)."""
        live = self._live.get(request_id)
        return None if live is None else live.output

    # -- the step ----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One scheduler step: prefill chunks + one decode batch. Returns finished outputs.

        ``schedule`` -> :meth:`_prefill` -> :meth:`_decode` -> ``update`` -> :meth:`_emit`; with
        ``fuse_mixed_steps`` a step with both is one :meth:`_prefill` call. An engine failure
        finishes the step's requests with an error (their KV blocks freed) and re-raises.
        """
        step = self.scheduler.schedule()
        sampled: dict[str, int] = {}
        t_step = time.perf_counter()
        fused = self.fuse_mixed_steps and bool(step.prefills) and bool(step.decodes)
        try:
            self._prefill(step.prefills, sampled, step.decodes if fused else ())
            if not fused:
                self._decode(step.decodes, sampled)
        except Exception as e:  # an engine failure finishes the step's requests, frees blocks
            for rid in {p.request_id for p in step.prefills} | {d.request_id for d in step.decodes}:
                self.scheduler.finish_request(rid, RequestStatus.FINISHED_ERROR, str(e))
            self.scheduler.update(step, {})
            raise
        finished = self.scheduler.update(step, sampled)
        self.steps += 1
        self.num_preemptions += len(step.preempted)
        self._log_step_cost(step, time.perf_counter() - t_step)
        self.step_stats.on_step(
            time.monotonic(), decode_batch_size=len(step.decodes), kv_blocks_used=self.block_pool.num_used
        )
        return self._emit(sampled, finished)

    def _prefill(
        self, prefills: Sequence[ScheduledPrefill], sampled: dict, decodes: Sequence[ScheduledDecode] = ()
    ) -> None:
        """Run the prefill engine on this step's chunks (and ``decodes`` as 1-token rows, a fused
        step); sample the rows of last chunks and of the decodes into ``sampled`` (request id ->
        token id). Marks prefill start/end on the request timers."""
        if not prefills:
            return
        now = time.monotonic
        for p in prefills:
            live = self._live[p.request_id]
            if not live.prefill_started:
                live.timer.on_prefill_start(now())
                live.prefill_started = True
                cached = live.request.num_cached_tokens or 0
                live.timer.cached_prompt_tokens = live.output.cached_tokens = cached
        batch = PrefillBatch.from_scheduled([*prefills, *(d.as_prefill_chunk() for d in decodes)])
        logits = self.engine.prefill(batch)  # [S, V] float32, rows in batch.request_ids order
        self.engine_time_s += self.engine.last_step_s
        last = {p.request_id for p in prefills if p.is_last_chunk} | {d.request_id for d in decodes}
        rows = [i for i, rid in enumerate(batch.request_ids) if rid in last]
        if not rows:
            return
        rids = [batch.request_ids[i] for i in rows]
        toks = self._sample(logits[rows], rids)
        t = now()
        ended = {p.request_id for p in prefills}
        for rid, tok in zip(rids, toks):
            sampled[rid] = tok
            if rid in ended:
                self._live[rid].timer.on_prefill_end(t)

    def _decode(self, decodes: tuple[ScheduledDecode, ...], sampled: dict[str, int]) -> None:
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
        if self.scheduler.chunk_policy is None or self.step_cost is None or step.is_empty:
            return
        predicted = self.step_cost.predict_step_s(step)
        policy, prefill_tokens = self.scheduler.chunk_policy, sum(p.num_tokens for p in step.prefills)
        factor = getattr(policy, "host_factor", 1.0)  # (what the step was planned with)
        self.step_cost_log.append(StepSample(predicted, measured_s, prefill_tokens, len(step.decodes), factor))
        if isinstance(policy, SloChunkPolicy) and prefill_tokens and step.decodes:  # a mixed step: re-plan
            self.scheduler.chunk_policy = policy.tracking_host(self.step_cost_log)

    def _emit(self, sampled: dict[str, int], finished: list[Request]) -> list[RequestOutput]:
        """Detokenize the sampled tokens into the outputs (stop strings finish requests), then
        close the finished ones; returns their outputs."""
        t = time.monotonic()
        for rid, tok in sampled.items():
            live = self._live.get(rid)
            if live is None:
                continue
            piece = live.detok.add(tok)
            live.output.output_token_ids.append(tok)
            live.timer.on_tokens(t, 1, piece)
            live.request.itl_sum_s = t - live.timer.token_times_s[0]  # the slo policy's TPOT so far
            if live.append_text(piece):
                self.scheduler.finish_request(rid, RequestStatus.FINISHED_STOPPED)
                finished.append(live.request)
        done = []
        for req in finished:
            live = self._live.pop(req.request_id, None)
            if live is None:
                continue
            live.append_text(live.detok.flush(), final=True)
            live.finish(req.finish_reason or "stop", req.error_message)
            done.append(live.output)
        return done

    def _sample(self, logits: np.ndarray, rids: list[str]) -> list[int]:
        params = [self._live[r].request.sampling_params for r in rids]
        gens = [self._live[r].rng for r in rids]
        return [int(x) for x in sample(np.asarray(logits, np.float32), params, gens)]

    # -- convenience -------------------------------------------------------------------------
    def run_until_done(self) -> list[RequestOutput]:
        outs = []
        while self.scheduler.has_unfinished():
            outs.extend(self.step())
        return outs

    def generate(
        self,
        prompts: Iterable[str | Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        chat: bool = False,
    ) -> list[RequestOutput]:
        """Run all prompts as one continuous batch; outputs in prompt order."""
        prompts = list(prompts)
        plist = params if isinstance(params, (list, tuple)) else [params] * len(prompts)
        rids = [self.add_request(p, sp, chat=chat) for p, sp in zip(prompts, plist)]
        by_id = {o.request_id: o for o in self.run_until_done()}
        return [by_id[r] for r in rids]

    def stream(
        self, prompt: str | Sequence[int], params: SamplingParams | None = None, *, chat: bool = False
    ) -> Iterator[str]:
        """Yield text pieces as they are produced (UTF-8 safe); the final RequestOutput is in
        ``self.last_output`` afterwards."""
        pieces: list[str] = []
        rid = self.add_request(prompt, params, chat=chat, on_text=pieces.append)
        self.last_output = None
        while self.scheduler.has_unfinished():
            for out in self.step():
                if out.request_id == rid:
                    self.last_output = out
            while pieces:
                yield pieces.pop(0)
