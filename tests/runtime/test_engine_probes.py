"""The ITL-during-prefill probe's bookkeeping against a scripted client (no engine): a partner's
prefill window is counted only while the decoding request outlives it, and no partner starts
once the decoder is done (their TTFT would be a prefill with nobody beside it)."""

from __future__ import annotations

import asyncio
import time

from trtpipe.runtime.measure.engine_probes import NUM_PARTNERS, STEADY_TOKENS, Stream, probe_itl_during_prefill

PARTNER_TOKENS = 30  # a partner's first token comes after the decoder's next 30 tokens (or at once, alone)


class ScriptedClient:
    """Decoder D: one token per event-loop tick up to its max_tokens. A partner: its one token once D
    has emitted PARTNER_TOKENS more, or right away when D is done."""

    def __init__(self) -> None:
        self.decoder: Stream | None = None
        self.partners: list[Stream] = []
        self.tasks: list[asyncio.Task] = []

    async def start(self, prompt_ids, max_tokens, cache_salt=None) -> Stream:
        s = Stream(sent_s=time.monotonic())
        if self.decoder is None:
            self.decoder = s
            self.tasks.append(asyncio.ensure_future(self._decode(s, max_tokens)))
        else:
            self.partners.append(s)
            self.tasks.append(asyncio.ensure_future(self._partner(s)))
        return s

    async def _decode(self, s: Stream, n: int) -> None:
        for _ in range(n):
            if s.done:
                return
            await asyncio.sleep(0.0005)
            s.token_times_s.append(time.monotonic())
        s.done = True

    async def _partner(self, s: Stream) -> None:
        d = self.decoder
        mark = len(d.token_times_s)
        while not d.done and len(d.token_times_s) < mark + PARTNER_TOKENS:
            await asyncio.sleep(0)
        s.token_times_s.append(time.monotonic())
        s.done = True

    async def cancel(self, s: Stream) -> float:
        s.done = True
        return 0.0

    async def close(self) -> None:
        for t in self.tasks:
            t.cancel()


def _run(max_tokens: int):
    client = ScriptedClient()
    steady, during, partners = asyncio.run(probe_itl_during_prefill(client, [1] * 4, [1] * 64, max_tokens))
    return client, steady, during, partners


def test_every_partner_counts_while_the_decoder_outlives_them():
    client, steady, during, partners = _run(4096)
    assert len(client.partners) == NUM_PARTNERS and len(partners) == NUM_PARTNERS
    assert len(during) >= NUM_PARTNERS * (PARTNER_TOKENS - 1) and len(steady) >= NUM_PARTNERS * (STEADY_TOKENS - 1)
    assert client.decoder.done  # cancelled once the partners were done


def test_a_decoder_that_ends_early_stops_the_partners_and_drops_the_lone_prefill():
    """D ends 10 tokens into the second partner's prefill (its steady gaps, the first partner's 30
    tokens, steady gaps again, then 10): that partner's window is not counted, and no third partner
    starts."""
    client, steady, during, partners = _run(STEADY_TOKENS + 3 + PARTNER_TOKENS + STEADY_TOKENS + 10)
    assert len(client.partners) == 2 and len(partners) == 1
    assert during  # D's gaps during the first partner
