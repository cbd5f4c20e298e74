"""Continuous batching with chunked prefill and recompute preemption.

Follows vLLM v1 ``Scheduler`` (``vllm/v1/core/sched/scheduler.py``): one token budget per step,
running requests first, then waiting ones in arrival order (FCFS); "does not fit" from the
:class:`KVCacheManager` leads to preempting the newest running request (its blocks are freed at
once and it is recomputed later) or to queueing.

One step (``schedule`` -> engines -> ``update``)::

    budget = max_num_tokens   (chunk_policy: decodes + the policy's prefill cap, see slo_policy)
    running, oldest first:  decoding  -> 1 token (ScheduledDecode)         budget -= 1
                                         (+ k proposed tokens to verify: sched/speculation.py)
                            prefilling -> next chunk (ScheduledPrefill)     budget -= chunk
                            (chunks leave one token of budget for every decode behind them)
                            no KV block?  preempt the newest running request, retry;
                                          if that is the request itself, it waits
    waiting, FCFS, only if nobody was preempted this step:
                            while budget and running < max_batch_size and the chunk fits:
                                admit: reuse the longest cached prefix (prefix caching),
                                prefill the first chunk of the rest

Every running request in its decode phase is in ``decodes`` every step, so sequences at
different decode steps share one decode batch. A prompt longer than the budget is prefilled in
chunks over several steps (``start_position`` > 0); the token sampled after the last chunk is
the first output token.

Never deadlock: a request whose KV could never fit the whole pool (or whose prompt leaves no
room for one output token in ``max_seq_len``) is finished at ``add_request`` with
``FINISHED_ERROR`` and a message; every other request fits alone, and the oldest running request
can always preempt all newer ones, so every step with work schedules something.

Prefix caching (vLLM v1's automatic prefix caching): at admission a request's full blocks are
named by chained hashes (:mod:`trtpipe.runtime.kv.prefix_cache`); the longest run of them already in
the pool is shared instead of recomputed, capped so that at least the last token is computed (its
logits give the next token). After every step the blocks that became full are offered to the
cache (``update``), so a preempted request usually finds its own blocks again.

Choices of ``n`` > 1 wait for their first choice's prefill, then fork its prompt KV
(:mod:`trtpipe.runtime.sched.admission`). The step's records live in :mod:`trtpipe.runtime.sched.step`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from trtpipe.runtime.errors import RequestError, TrtpipeError
from trtpipe.runtime.kv.cache_manager import KVCacheManager
from trtpipe.runtime.kv.prefix_cache import PrefixCache
from trtpipe.runtime.sched.admission import chunk_cap, fork_choice, forkable_choices, never_fits, waits_for_sibling
from trtpipe.runtime.sched.records import decode_record, prefill_record
from trtpipe.runtime.sched.request import Request, RequestStatus
from trtpipe.runtime.sched.speculation import Speculator, propose_drafts, verify_tokens
from trtpipe.runtime.sched.step import ChunkPolicy, DecodeProgress, ScheduledDecode, ScheduledPrefill, SchedulerStep


class Scheduler:
    """Decides, every step, which tokens the prefill and decode engines compute.

    Args:
        kv_manager: owns the block tables (its pool is ``kv_manager.block_pool``).
        max_num_tokens: token budget per step (decode tokens + prefill chunk tokens).
        max_batch_size: most running sequences (the decode engine's batch limit).
        max_seq_len: most tokens (prompt + output) per sequence.
        eos_token_ids: token ids that end a request unless ``ignore_eos``.
        enable_prefix_caching: reuse cached KV blocks of earlier requests (off by default here;
            :class:`~trtpipe.runtime.llm.LLM` turns it on unless the recipe says otherwise).
        build_hash: names the artifact in every block hash (KV of another build never matches).
        chunk_policy: caps each step's prefill tokens given what it decodes (``slo`` policy,
            :class:`~trtpipe.runtime.sched.slo_policy.SloChunkPolicy`); None = FCFS chunks of up to
            ``max_num_tokens``. Settable between steps (``scheduler.chunk_policy = ...``).
        fork_choices: n > 1 choices fork the prompt KV (an engine that copies blocks); False = share.
        speculator: proposals to verify (:class:`~trtpipe.runtime.sched.speculation.Speculator`); None = off.

    ``prefix_cache_queries`` / ``prefix_cache_hits`` count prompt tokens looked up / found in the
    cache at each admission (vLLM's ``prefix_cache_queries`` / ``prefix_cache_hits``, in tokens).

    Raises :class:`TrtpipeError` for limits that cannot work (e.g. a budget smaller than the
    batch, which could not give every running sequence its decode token).
    """

    def __init__(
        self,
        kv_manager: KVCacheManager,
        max_num_tokens: int,
        max_batch_size: int,
        max_seq_len: int,
        eos_token_ids: Iterable[int] = (),
        enable_prefix_caching: bool = False,
        build_hash: str = "",
        chunk_policy: ChunkPolicy | None = None,
        fork_choices: bool = False,
        speculator: Speculator | None = None,
    ) -> None:
        for name, value in (
            ("max_num_tokens", max_num_tokens),
            ("max_batch_size", max_batch_size),
            ("max_seq_len", max_seq_len),
        ):
            if not isinstance(value, int) or value < 1:
                raise TrtpipeError(f"{name} = {value!r}: expected an int >= 1; fix: set it in the recipe")
        if max_num_tokens < max_batch_size:
            raise TrtpipeError(
                f"max_num_tokens = {max_num_tokens} < max_batch_size = {max_batch_size}: every "
                "running sequence needs one token of the step budget for its decode; fix: raise "
                "max_num_tokens to at least max_batch_size"
            )
        self.kv_manager = kv_manager
        self.max_num_tokens = max_num_tokens
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.prefix_cache = PrefixCache(kv_manager, build_hash, enable_prefix_caching)
        self.chunk_policy = chunk_policy
        self.last_prefill_cap: int | None = None  # the policy's cap in the last step (reports)
        self.prefix_cache_queries = 0  # tokens looked up at admission
        self.prefix_cache_hits = 0  # of those, tokens found cached
        self._requests: dict[str, Request] = {}  # unfinished requests by id
        self._waiting: deque[Request] = deque()  # WAITING and PREEMPTED, admission order
        self._running: list[Request] = []  # RUNNING, oldest admission first
        self._unreported: list[Request] = []  # finished outside a step, reported by update()
        self.fork_choices = fork_choices  # n > 1: fork the prompt KV (needs an engine that copies blocks)
        self._forking: dict[str, list[Request]] = {}  # this step: parent id -> choices that fork it
        self._step_in_flight = False
        self.speculator = speculator  # speculative decoding (sched/speculation.py); None = off

    # -- queries -----------------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def kv_blocks_used(self) -> int:
        return self.kv_manager.block_pool.num_used

    def has_unfinished(self) -> bool:
        """True while some request is waiting, running, or finished but not yet reported."""
        return bool(self._requests) or bool(self._unreported)

    def get_request(self, request_id: str) -> Request | None:  # None when unknown or finished
        return self._requests.get(request_id)

    # -- requests in and out -----------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        """Queue a new request (FCFS), made by :func:`~trtpipe.runtime.sched.request.new_request`
        (which checked its parameters, prompt and length: they are not checked again here).

        Raises :class:`RequestError` for an id already in use or a request that is not new. A
        request that can never run (more KV than the whole pool) is finished at once with
        ``FINISHED_ERROR`` and ``error_message``, and reported by the next ``update()``.
        """
        assert request.prompt_token_ids and len(request.prompt_token_ids) < self.max_seq_len, "use new_request()"
        if request.request_id in self._requests:
            raise RequestError(
                f"request_id = {request.request_id!r}: already in use by an unfinished request; "
                "fix: give every request a unique id"
            )
        if request.status is not RequestStatus.WAITING or request.output_token_ids:
            raise RequestError(
                f"request {request.request_id!r}: status = {request.status.value}: expected a "
                "new WAITING request without outputs; fix: create a new Request"
            )
        reason = never_fits(request, self.kv_manager, self.max_num_tokens, self.max_seq_len)
        if reason is not None:
            request.finish(RequestStatus.FINISHED_ERROR, reason)
            self._unreported.append(request)
            return
        self._requests[request.request_id] = request
        self._waiting.append(request)

    def finish_request(
        self, request_id: str, status: RequestStatus, error_message: str | None = None
    ) -> Request | None:
        """Finish an unfinished request now and free its KV blocks at once.

        For the layer above: stop strings (``FINISHED_STOPPED``), cancellation and client
        disconnect (``FINISHED_ABORTED``), engine errors (``FINISHED_ERROR``). Allowed between
        ``schedule`` and ``update`` (``update`` then ignores the request). Returns the request,
        or None when the id is unknown or already finished (races with a normal finish are fine).
        """
        request = self._requests.pop(request_id, None)
        if request is None:
            return None
        if request.status is RequestStatus.RUNNING:
            self._running.remove(request)
        else:
            self._waiting.remove(request)
        self.kv_manager.free(request_id)
        request.finish(status, error_message)
        return request

    def abort(self, request_id: str) -> Request | None:
        """Cancel a request (client gone, user abort): ``FINISHED_ABORTED``, blocks freed now."""
        return self.finish_request(request_id, RequestStatus.FINISHED_ABORTED)

    # -- the step ----------------------------------------------------------------------------

    def schedule(self) -> SchedulerStep:
        """Pick this step's decodes and prefill chunks; allocate their slots. Pair with ``update``."""
        assert not self._step_in_flight, "schedule() called twice without update()"
        self._step_in_flight = True
        kv = self.kv_manager
        budget = self._step_token_budget()
        prefills: list[ScheduledPrefill] = []
        decodes: list[ScheduledDecode] = []
        preempted: list[str] = []
        drafts = self._drafts(budget)  # speculative decoding: request id -> proposed tokens

        i = 0
        while i < len(self._running):  # preemption pops from the tail, so re-check the length
            request = self._running[i]
            if request.is_prefilling:
                # Leave one token for every decode behind us, so decodes are never starved. (With
                # FCFS admission only the newest request can be mid-prefill; this is a guard.)
                reserved = sum(1 for r in self._running[i + 1 :] if not r.is_prefilling)
                todo = min(request.num_prefill_tokens - request.num_computed_tokens, chunk_cap(request))
                num_new = min(todo, budget - reserved)
                if num_new <= 0:
                    i += 1
                    continue
            else:
                num_new = verify_tokens(kv, request, drafts, len(self._running) - i - 1)
            if not self._allocate_or_preempt(request, num_new, preempted):
                break  # it preempted itself: it was the newest, nothing is behind it
            budget -= num_new
            if request.is_prefilling:
                prefills.append(prefill_record(self.kv_manager, request, num_new))
            else:
                decodes.append(
                    decode_record(self.kv_manager, request, drafts.get(request.request_id, ())[: num_new - 1])
                )
            i += 1

        # Admitting while preempting would just swap requests in and out (vLLM does the same).
        while not preempted and self._waiting and budget > 0 and len(self._running) < self.max_batch_size:
            request = self._waiting[0]
            if waits_for_sibling(request, self._requests):
                break  # n > 1: its prompt KV comes from the first choice's prefill (FCFS: all wait)
            hit = self._cached_prefix(request) if chunk_cap(request) > 1 else []  # prompt logprobs: compute all
            num_cached = len(hit) * kv.block_size
            num_new = min(request.num_tokens - num_cached, budget, chunk_cap(request))
            if not kv.allocate_slots(request.request_id, num_new, num_cached, cached_block_ids=hit):
                break  # FCFS: nobody overtakes the head of the queue
            self._waiting.popleft()
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = num_cached
            request.num_prefill_tokens = request.num_tokens  # prompt (+ outputs after preemption)
            if self.prefix_cache.enabled:
                self.prefix_cache_queries += request.num_tokens
                self.prefix_cache_hits += num_cached
            if request.num_cached_tokens is None:  # the first admission: prompt tokens reused
                request.num_cached_tokens = num_cached
            self._running.append(request)
            budget -= num_new
            prefills.append(prefill_record(self.kv_manager, request, num_new))

        return SchedulerStep(prefills=tuple(prefills), decodes=tuple(decodes), preempted=tuple(preempted))

    def update(self, step: SchedulerStep, sampled: Mapping[str, Any]) -> list[Request]:
        """Apply the engines' results; return the requests that finished (blocks already freed).

        ``sampled`` maps request id -> token id for every decode and every last prefill chunk
        (other entries are ignored); a verify row (a decode with proposed tokens) maps to the tokens
        it emits, its accepted proposal then one more: the slots of rejected ones are rolled back.
        Requests finished since ``schedule`` are skipped. Stops, in
        order: EOS (unless ``ignore_eos``) or a stop token -> "stop"; ``max_new_tokens`` or
        ``max_seq_len`` reached -> "length". Requests finished by ``add_request`` are included.
        """
        assert self._step_in_flight, "update() without schedule()"
        self._step_in_flight = False
        forking, self._forking = self._forking, {}
        finished, self._unreported = self._unreported, []
        for prefill in step.prefills:
            request = self._live(prefill.request_id)
            if request is None:
                continue
            request.num_computed_tokens += prefill.num_tokens
            self._cache_full_blocks(request)
            for child in forking.pop(prefill.request_id, ()):  # before the parent may finish
                self._waiting.remove(child)
                fork_choice(self.kv_manager, request, child)
                self._running.append(child)
                if self._append_token(child, sampled[child.request_id]):
                    finished.append(child)
            if prefill.is_last_chunk and self._append_token(request, sampled[prefill.request_id]):
                finished.append(request)
        for decode in step.decodes:
            request = self._live(decode.request_id)
            if request is None:
                continue
            got = sampled[decode.request_id]
            tokens = tuple(got) if isinstance(got, Sequence) else (got,)
            request.num_computed_tokens += len(tokens)  # the last token + the accepted proposal
            if decode.draft_token_ids:
                self.kv_manager.truncate(request.request_id, request.num_computed_tokens)  # rejected slots
            self._cache_full_blocks(request, tokens[:-1])
            if any(self._append_token(request, tok) for tok in tokens):  # stops at the first finish
                finished.append(request)
        return finished

    # -- internals ---------------------------------------------------------------------------

    def _live(self, request_id: str) -> Request | None:
        request = self._requests.get(request_id)
        return request if request is not None and request.status is RequestStatus.RUNNING else None

    def _drafts(self, budget: int) -> dict[str, tuple[int, ...]]:
        """This step's proposals (:func:`~trtpipe.runtime.sched.speculation.propose_drafts`), {} when off."""
        if self.speculator is None:
            return {}
        n_wait, batch = len(self._waiting), self.max_batch_size
        return propose_drafts(self.speculator, self._running, n_wait, batch, budget, self.max_seq_len)

    def _step_token_budget(self) -> int:
        """``max_num_tokens``, or with a chunk policy: this step's decodes + its prefill cap."""
        if self.chunk_policy is None:
            return self.max_num_tokens
        decoding = [r for r in self._running if not r.is_prefilling]
        prefilling = next((r for r in self._running if r.is_prefilling), None)
        if prefilling is not None:
            context = prefilling.num_computed_tokens
        elif self._waiting:  # the next admission starts after its cached prefix, not at 0
            context = len(self._cached_prefix(self._waiting[0])) * self.kv_manager.block_size
        else:
            context = 0
        progress = tuple(DecodeProgress.of(r, self.max_seq_len) for r in decoding)
        pending = prefilling is not None or bool(self._waiting)  # else the cap sizes drafts only
        cap = self.chunk_policy.max_prefill_tokens(
            len(decoding), sum(r.num_computed_tokens + 1 for r in decoding), context, progress, pending
        )
        self.last_prefill_cap = cap
        return min(self.max_num_tokens, len(decoding) + cap)

    def fork_candidates(self, prefill: ScheduledPrefill) -> list[Request]:
        """Between ``schedule`` and ``update``: the choices (n > 1) that fork this prefill's request
        in ``update``, reserved now; the caller samples their first tokens into ``sampled``."""
        parent = self._live(prefill.request_id)
        if not self.fork_choices or parent is None or not prefill.is_last_chunk:
            return []
        room = self.max_batch_size - len(self._running) - sum(len(v) for v in self._forking.values())
        children = forkable_choices(parent, prefill.context_len, self._waiting, room)
        if children:
            self._forking[parent.request_id] = children
        return children

    def _cached_prefix(self, request: Request) -> list[int]:
        """Block ids of the longest cached prefix of ``request``'s tokens ([] when caching is off)."""
        return self.prefix_cache.cached_prefix(request.all_token_ids, request.block_hashes, request.cache_salt)

    def _cache_full_blocks(self, r: Request, accepted: tuple[int, ...] = ()) -> None:
        """Offer the blocks whose KV the engine just completed to the prefix cache (``accepted``:
        verified proposed tokens with KV, not appended to the request yet)."""
        tokens = r.all_token_ids + tuple(int(t) for t in accepted)
        self.prefix_cache.offer_full_blocks(r.request_id, tokens, r.block_hashes, r.num_computed_tokens, r.cache_salt)

    def _append_token(self, request: Request, token_id: int) -> bool:
        """Append a sampled token; finish the request if it must stop. Returns True if finished."""
        token_id = int(token_id)
        request.output_token_ids.append(token_id)
        params = request.sampling_params
        if (token_id in self.eos_token_ids and not params.ignore_eos) or token_id in params.stop_token_ids:
            status = RequestStatus.FINISHED_STOPPED
        elif len(request.output_token_ids) >= params.max_new_tokens or request.num_tokens >= self.max_seq_len:
            status = RequestStatus.FINISHED_LENGTH
        else:
            return False
        self.finish_request(request.request_id, status)
        return True

    def _allocate_or_preempt(self, request: Request, num_new: int, preempted: list[str]) -> bool:
        """Allocate slots, preempting the newest running requests until they fit.

        Returns False when ``request`` itself was the newest and got preempted.
        """
        while not self.kv_manager.allocate_slots(request.request_id, num_new, request.num_computed_tokens):
            victim = self._running.pop()
            self._preempt(victim)
            preempted.append(victim.request_id)
            if victim is request:
                return False
        return True

    def _preempt(self, request: Request) -> None:
        """Free all KV of a running request; it waits at the front and recomputes later."""
        self.kv_manager.free(request.request_id)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_prefill_tokens = 0
        request.num_preemptions += 1
        self._waiting.appendleft(request)


__all__ = ["ChunkPolicy", "Scheduler", "SchedulerStep", "ScheduledPrefill", "ScheduledDecode"]
