"""N-gram (prompt lookup) proposals from a request's own context: no second model.

The request's tokens so far (prompt + accepted outputs) are ``x[0..L)``. For n from ``max_n`` down
to ``min_n``, the suffix ``x[L-n..L)`` is looked up among the earlier n-grams of the context; on
the first hit ending at position ``i`` (its continuation starts at ``i``), the proposal is
``x[i .. i+k)`` (clipped at ``L``). Summaries repeat phrases of their document, code repeats
identifiers, an assistant quotes its system prompt: there the continuation is often right.

The index is incremental: one dict per n from n-gram -> the position its continuation starts
at (the *latest* occurrence: the most recent context predicts best; vLLM's proposer takes the
earliest match, llama.cpp's lookup weighs counts). An n-gram enters the index when its
continuation token exists (``x[i]`` for the n-gram ``x[i-n..i)``), so the current suffix never
matches itself. ``extend`` costs O(new tokens x (max_n - min_n + 1)), ``propose`` O(max_n + k):
O(1) amortized per generated token, O(context) memory.

    x:      a b c d a b c  ?            L = 7, n = 3: suffix (a b c) -> continuation at 3
    index3: (a b c) -> 3, (b c d) -> 4, (c d a) -> 5, (d a b) -> 6
    propose(k=2) -> (d, a)
"""

from __future__ import annotations

from collections.abc import Iterable


class NgramIndex:
    """Suffix n-gram lookup over one growing token sequence (``min_n <= n <= max_n``)."""

    def __init__(self, min_n: int, max_n: int, token_ids: Iterable[int] = ()):
        assert 1 <= min_n <= max_n, (min_n, max_n)
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self._index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_n, max_n + 1)}
        self.extend(token_ids)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, token_ids: Iterable[int]) -> None:
        """Append tokens (only ever appended: rejected proposals never enter)."""
        x = self.tokens
        for t in token_ids:
            i = len(x)  # the new token's position: the continuation of the n-grams ending before it
            for n, index in self._index.items():
                if i >= n:
                    index[tuple(x[i - n : i])] = i
            x.append(int(t))

    def sync(self, prompt: tuple[int, ...], outputs: list[int]) -> None:
        """Catch up with a request whose ``prompt + outputs`` this index holds a prefix of (O(new))."""
        have, num_prompt = len(self.tokens), len(prompt)
        assert have <= num_prompt + len(outputs), "the context only grows"
        if have < num_prompt:
            self.extend(prompt[have:])
            have = num_prompt
        self.extend(outputs[have - num_prompt :])

    def propose(self, k: int) -> tuple[tuple[int, ...], int]:
        """Up to ``k`` tokens continuing the longest matching suffix, and that n (0, () without a
        match)."""
        x, L = self.tokens, len(self.tokens)
        if k <= 0:
            return (), 0
        for n in range(min(self.max_n, L - 1), self.min_n - 1, -1):
            i = self._index[n].get(tuple(x[L - n :]))
            if i is not None:
                return tuple(x[i : min(i + k, L)]), n
        return (), 0


__all__ = ["NgramIndex"]
