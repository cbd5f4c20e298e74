"""``LLM``: the user-facing runtime object (vLLM's ``LLM`` / ``LLMEngine`` shape, trimmed).

    llm = LLM("artifacts/smollm2-135m-cpu/cpu")
    out = llm.generate(["What is the capital of France?"], SamplingParams(max_new_tokens=32), chat=True)
    for piece in llm.stream("Tell me a joke", chat=True): print(piece, end="")

The front door: it loads the artifact (manifest, tokenizer, engines over one paged KV pool,
block pool, KV manager, scheduler and its policy), takes requests (checked once, by
:meth:`new_request`), and steps them: each :meth:`step` is one
:class:`~trtpipe.runtime.core.step.StepRunner` step (prefill chunks and one decode batch:
continuous batching). Token ids and text are kept apart. Timings per request come from
:mod:`trtpipe.runtime.metrics.request_metrics` on the monotonic clock.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from trtpipe.runtime.artifact.chat_template import encode_prompt
from trtpipe.runtime.artifact.detokenizer import IncrementalDetokenizer
from trtpipe.runtime.artifact.manifest import Manifest, load_manifest
from trtpipe.runtime.artifact.tokenizer import Tokenizer
from trtpipe.runtime.core.calibrate import load_or_calibrate
from trtpipe.runtime.core.step import StepRunner
from trtpipe.runtime.engines.select import load_engine
from trtpipe.runtime.errors import RequestError
from trtpipe.runtime.kv.block_pool import BlockPool
from trtpipe.runtime.kv.cache_manager import KVCacheManager
from trtpipe.runtime.kv.pool import KVPool
from trtpipe.runtime.metrics.request_metrics import RequestTimer, StepStats
from trtpipe.runtime.sample.grammar import GrammarCompiler
from trtpipe.runtime.sample.logprobs import check_logprobs_mode
from trtpipe.runtime.sample.params import SamplingParams, require_bools
from trtpipe.runtime.sample.sampler import make_generator
from trtpipe.runtime.sched.request import Request, new_request
from trtpipe.runtime.sched.request_output import LiveRequest, RequestOutput
from trtpipe.runtime.sched.scheduler import Scheduler
from trtpipe.runtime.sched.slo_policy import choose_chunk_policy
from trtpipe.runtime.sched.step_cost import StepCostModel
from trtpipe.runtime.speculative.config import SpeculativeConfig
from trtpipe.runtime.speculative.setup import build_speculator

if TYPE_CHECKING:  # engines import their backends (onnxruntime, tensorrt) when constructed
    from trtpipe.runtime.engines.base import Engine
    from trtpipe.runtime.metrics.spec_counters import SpeculationCounters


class LLM:
    """Prefill + decode engines over one paged KV pool, with a continuous-batching scheduler.

    Args:
        artifact_dir: a built artifact (``trtpipe build``); read through its manifest only.
        num_threads: ONNX Runtime intra-op threads (None: the artifact's setting or ORT's default).
        prefix_caching: reuse the KV of earlier requests' identical prompt prefixes (automatic
            prefix caching, on by default: outputs are the same as without it; the recipe's
            ``runtime.prefix_caching`` sets it in ``trtpipe validate``).
        scheduler_policy: ``slo`` (size prefill chunks so steps stay within ``tpot_budget_ms``,
            see :mod:`trtpipe.runtime.sched.slo_policy`) or ``fcfs``; ``slo`` without a budget is FCFS.
        tpot_budget_ms, itl_budget_ms, itl_during_prefill_ratio: the ``slo`` policy's budgets and ratio
            (None = none; change them with :meth:`set_tpot_budget`); a budget measures the engine's
            step-cost model once.
        fuse_mixed_steps: a step's prompt chunks and decodes in one engine call where it can; False = two.
        engine: cpu artifacts: ``auto`` (the native engine where the artifact has one, else ONNX
            Runtime), ``native`` or ``ort``.
        logprobs_mode: "raw" (log-softmax of the engine's logits, the default, vLLM's
            ``raw_logprobs``) or "processed" (of the logits sampled from: after bias, penalties,
            the grammar mask and temperature).
        speculative: a :class:`~trtpipe.runtime.speculative.config.SpeculativeConfig`: speculative decoding with
            n-gram proposals (:func:`~trtpipe.runtime.speculative.setup.build_speculator`; change it
            with :meth:`set_speculative`); None = off.

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
        itl_during_prefill_ratio: float | None = None,
        fuse_mixed_steps: bool = True,
        engine: str = "auto",
        logprobs_mode: str = "raw",
        speculative: SpeculativeConfig | None = None,
    ):
        require_bools(prefix_caching=prefix_caching, fuse_mixed_steps=fuse_mixed_steps)
        self.manifest: Manifest = load_manifest(artifact_dir)
        m = self.manifest
        eos = (m.model.eos_token_ids or (None,))[0]
        self.tokenizer = Tokenizer.from_file(
            m.path(m.tokenizer_file), bos_token_id=m.model.bos_token_id, eos_token_id=eos
        )
        self.pool = KVPool(m.kv)
        self.engine: Engine = load_engine(m, self.pool, num_threads, engine)
        self.capabilities = caps = self.engine.capabilities  # what it can do (engines/base.py)
        self.block_pool = BlockPool(m.kv.num_blocks)
        self.kv_manager = KVCacheManager(self.block_pool, m.kv.block_size, m.kv.sliding_window)
        self.fuse_mixed_steps = bool(fuse_mixed_steps and caps.fuses_mixed_steps)
        speculator, self.speculative_description = build_speculator(  # description: one line for reports
            speculative, self.engine, m, self.block_pool, m.kv.block_size, fused=self.fuse_mixed_steps
        )
        # The artifact's identity in every block hash: its build hash and its inputs (weights).
        build_id = f"{(m.build_info or {}).get('build_hash') or m.recipe_hash}:{m.inputs_hash}"
        lim = m.limits
        self.scheduler = Scheduler(
            self.kv_manager, lim.max_num_tokens, lim.max_batch_size, lim.max_seq_len, eos_token_ids=m.model.eos_token_ids,
            enable_prefix_caching=prefix_caching, build_hash=build_id,
            fork_choices=caps.copies_blocks, speculator=speculator,
        )  # fmt: skip
        step_stats = step_stats or StepStats(num_kv_blocks=m.kv.num_blocks - 1)
        self._live: dict[str, LiveRequest] = {}
        self._ids = itertools.count()
        if scheduler_policy not in ("slo", "fcfs"):
            raise RequestError(f"scheduler_policy = {scheduler_policy!r}: expected 'slo' or 'fcfs'")
        self.scheduler_policy = scheduler_policy
        self.num_threads = num_threads
        self.step_cost: StepCostModel | None = None
        self._runner = StepRunner(
            self.engine, self.scheduler, self._live, step_stats, fuse_mixed_steps=self.fuse_mixed_steps,
            step_cost=lambda: self.step_cost, grammars=lambda: self.grammars,
            logprobs_mode=check_logprobs_mode(logprobs_mode),
        )  # fmt: skip
        self._grammars: GrammarCompiler | None = None
        self.step_cost_log = self._runner.step_cost_log  # the slo policy's (predicted, measured) steps
        self.set_tpot_budget(tpot_budget_ms, itl_budget_ms, itl_during_prefill_ratio)

    def set_tpot_budget(
        self,
        tpot_budget_ms: float | None,
        itl_budget_ms: float | None = None,
        itl_during_prefill_ratio: float | None = None,
    ) -> str:
        """Apply the scheduler policy for ``tpot_budget_ms`` (None: the ITL budget, else FCFS),
        ``itl_budget_ms`` (None: every step within the TPOT budget) and ``itl_during_prefill_ratio``
        (None: none; else steps beside decodes within that many decode-only steps), between steps.
        Returns the report line of :func:`~trtpipe.runtime.sched.slo_policy.choose_chunk_policy`;
        raises :class:`TrtpipeError` for a budget that is not a finite number of ms > 0 or a ratio <= 1."""
        lim = self.manifest.limits
        policy, why = choose_chunk_policy(
            self.scheduler_policy, tpot_budget_ms, itl_budget_ms, itl_during_prefill_ratio,
            cost=self.step_cost_model, block_size=self.kv_manager.block_size, max_num_tokens=lim.max_num_tokens,
            max_batch_size=lim.max_batch_size,
        )  # fmt: skip
        self.scheduler.chunk_policy = policy
        return why

    def set_speculative(self, config: SpeculativeConfig | None) -> str:
        """Speculative decoding on (``config``) or off (None) between steps; returns the report line."""
        self.scheduler.speculator, self.speculative_description = build_speculator(
            config, self.engine, self.manifest, self.block_pool, self.kv_manager.block_size, fused=self.fuse_mixed_steps
        )
        return self.speculative_description

    @property
    def speculation_counters(self) -> SpeculationCounters | None:
        """Speculative decoding's totals since load or :meth:`reset_traffic_counters`; None while off."""
        return None if self.scheduler.speculator is None else self.scheduler.speculator.counters

    def reset_traffic_counters(self) -> None:
        """Forget what ran so far (warm-up): prefix-cache counters, speculation totals and prior, step-cost log."""
        self.scheduler.prefix_cache_queries = self.scheduler.prefix_cache_hits = 0
        if self.scheduler.speculator is not None:
            self.scheduler.speculator.reset_counters()
        self.step_cost_log.clear()

    def step_cost_model(self) -> StepCostModel:
        """The engine's step-cost model: the artifact's ``step_cost.json`` or measured now."""
        if self.step_cost is None:
            lim = self.manifest.limits
            self.step_cost = load_or_calibrate(
                self.manifest.path("."), self.engine, self.block_pool, self.kv_manager.block_size,
                lim.max_num_tokens, lim.max_batch_size, self.num_threads, fused=self.fuse_mixed_steps,
            )  # fmt: skip
        return self.step_cost

    @property
    def grammars(self) -> GrammarCompiler:
        """The structured-output compiler for this artifact's tokenizer (made on first use)."""
        if self._grammars is None:
            m = self.manifest
            text = Path(m.path(m.tokenizer_file)).read_text(encoding="utf-8")
            self._grammars = GrammarCompiler(text, self.tokenizer.vocab_size, self.tokenizer.eos_token_id)
        return self._grammars

    prefix_cache_queries = property(lambda self: self.scheduler.prefix_cache_queries, doc="Prompt tokens looked up.")
    prefix_cache_hits = property(lambda self: self.scheduler.prefix_cache_hits, doc="Prompt tokens found cached.")

    # -- requests ----------------------------------------------------------------------------
    def encode_prompt(self, prompt: str | bytes, chat: bool = False) -> list[int]:
        """Token ids of a prompt (chat template from the model metadata when ``chat``); see
        :func:`trtpipe.runtime.artifact.chat_template.encode_prompt`."""
        return encode_prompt(self.tokenizer, self.manifest.model.chat_template, prompt, chat)

    def encode_chat(self, messages: Sequence[dict[str, str]], *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of a conversation (``[{"role": "system"|"user"|"assistant", "content": ...}]``)
        under the model's chat template, ending with the assistant header (the model answers next).

        Raises :class:`RequestError` (``field`` "messages") when the model has no chat template or
        the template rejects the conversation.
        """
        tpl = self.manifest.model.chat_template
        return encode_prompt(self.tokenizer, tpl, messages, chat=True, add_special_tokens=add_special_tokens)

    def new_request(
        self,
        prompt: str | bytes | Sequence[int],
        params: SamplingParams | None = None,
        *,
        chat: bool = False,
        request_id: str | None = None,
        arrival_s: float | None = None,
        cache_salt: str | None = None,
    ) -> Request:
        """A checked request for this artifact (text is encoded first, chat-templated when
        ``chat``), not queued yet: :func:`~trtpipe.runtime.sched.request.new_request` is the one
        place requests are checked. Pure (no engine state): the server calls it on its own
        thread, then :meth:`submit` on the engine's. A ``params.structured`` schema is compiled
        here (cached by its hash) and the request gets its own matcher: call this off an event
        loop. Raises :class:`RequestError` (``field`` "response_format" for a schema llguidance
        cannot compile)."""
        ids = self.encode_prompt(prompt, chat) if isinstance(prompt, (str, bytes)) else list(prompt)
        req = new_request(
            request_id or f"req-{next(self._ids)}",
            ids,
            params or SamplingParams(),
            max_seq_len=self.manifest.limits.max_seq_len,
            vocab_size=self.tokenizer.vocab_size,
            arrival_time_s=arrival_s,
            cache_salt=cache_salt,
        )
        if req.sampling_params.structured is not None:
            req.grammar = self.grammars.matcher(req.sampling_params.structured)
        return req

    def new_requests(
        self,
        prompt: str | bytes | Sequence[int],
        params: Sequence[SamplingParams],
        *,
        chat: bool = False,
        request_id: str | None = None,
        cache_salt: str | None = None,
    ) -> list[Request]:
        """The choices of one prompt (OpenAI's ``n``): one checked request per ``params`` entry
        (choice i typically with seed + i), ids ``<id>`` then ``<id>-1``, ``<id>-2``... Every
        choice after the first waits for the first's prefill, then forks its prompt KV (copy-on-
        write of the partial last block; :mod:`trtpipe.runtime.sched.admission`) and samples its
        first token from the same logits; an engine that cannot copy blocks (TensorRT) shares the
        full blocks through the prefix cache instead. Raises :class:`RequestError` as :meth:`new_request`."""
        ids = self.encode_prompt(prompt, chat) if isinstance(prompt, (str, bytes)) else list(prompt)
        base = request_id or f"req-{next(self._ids)}"
        arrival = time.monotonic()
        out = []
        for i, p in enumerate(params):
            req = self.new_request(
                ids, p, request_id=base if i == 0 else f"{base}-{i}", arrival_s=arrival, cache_salt=cache_salt
            )
            shares = self.scheduler.fork_choices or self.scheduler.prefix_cache.enabled
            req.share_prefix_with = base if i > 0 and shares else None
            out.append(req)
        return out

    def submit(self, request: Request, on_text: Callable[[str], None] | None = None) -> str:
        """Queue a request made by :meth:`new_request`; returns its id. ``on_text`` gets each new
        text piece (whole characters). Raises :class:`RequestError` for an id already in use."""
        ids = request.prompt_token_ids
        self.scheduler.add_request(request)
        sp = request.sampling_params
        out = RequestOutput(request.request_id, ids, logprobs=None if sp.logprobs is None else [])
        out.prompt_logprobs = None if sp.prompt_logprobs is None else [None]
        self._live[request.request_id] = LiveRequest(
            request,
            IncrementalDetokenizer(self.tokenizer.backend, list(ids)),
            RequestTimer(request.request_id, prompt_tokens=len(ids), arrival_s=request.arrival_time_s),
            make_generator(request.sampling_params),
            out,
            on_text,
        )
        return request.request_id

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
        """Queue a request (:meth:`new_request` then :meth:`submit`); returns its id. ``prompt`` is
        text or token ids. ``cache_salt``: only requests with the same salt share prefix-cache
        blocks (vLLM's ``cache_salt``; e.g. one per tenant). None = the common, unsalted cache.

        Raises :class:`RequestError` for an empty prompt, invalid UTF-8, bad sampling parameters,
        or a prompt longer than ``max_seq_len`` (the request is refused; nothing else is disturbed).
        """
        req = self.new_request(
            prompt, params, chat=chat, request_id=request_id, arrival_s=arrival_s, cache_salt=cache_salt
        )
        return self.submit(req, on_text)

    def cancel(self, request_id: str) -> bool:
        """Cancel a request: its KV blocks are freed at once. False if unknown or finished."""
        req = self.scheduler.abort(request_id)
        live = self._live.pop(request_id, None)
        if live is not None:
            live.finish("abort")
        return req is not None

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def unfinished_requests(self) -> list[Request]:
        """The requests submitted and not finished yet, in submission order (for load reports)."""
        return [live.request for live in self._live.values()]

    def partial_output(self, request_id: str) -> RequestOutput | None:
        """The live (unfinished) output of a request, updated in place by every step; None once
        it finished or was cancelled (the finished one is what :meth:`step` returned)."""
        live = self._live.get(request_id)
        return None if live is None else live.output

    # -- the step ----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One scheduler step (:meth:`trtpipe.runtime.core.step.StepRunner.step`): prefill chunks
        + one decode batch; returns the outputs of the requests that finished."""
        return self._runner.step()

    engine_time_s = property(lambda self: self._runner.engine_time_s, doc="Seconds inside the engines since load.")
    grammar_time_s = property(lambda self: self._runner.grammar_time_s, doc="Seconds on grammar masks since load.")

    @property
    def step_stats(self) -> StepStats:
        """The per-step counters the steps feed (a workload swaps in its own for a run)."""
        return self._runner.step_stats

    @step_stats.setter
    def step_stats(self, stats: StepStats) -> None:
        self._runner.step_stats = stats

    steps = property(lambda self: self._runner.steps, doc="Steps run since load.")
    num_preemptions = property(lambda self: self._runner.num_preemptions, doc="Requests preempted, all steps.")

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
        """Run all prompts as one continuous batch; outputs in prompt order. A prompt whose params
        ask ``n`` > 1 gives n outputs in a row (choice i sampled with seed + i, prompt KV shared:
        :meth:`new_requests`). A single ``str`` is one prompt (as in vLLM), not a list of characters."""
        prompts = [prompts] if isinstance(prompts, (str, bytes)) else list(prompts)
        plist = params if isinstance(params, (list, tuple)) else [params] * len(prompts)
        rids = []
        for p, sp in zip(prompts, plist):
            sp = sp or SamplingParams()
            seeds = [None if sp.seed is None else sp.seed + i for i in range(sp.n)]
            for req in self.new_requests(p, [replace(sp, seed=s, n=1) for s in seeds], chat=chat):
                rids.append(self.submit(req))
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
