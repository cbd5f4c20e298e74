"""Block hashes for automatic prefix caching: the name of a full KV block.

Follows vLLM v1 ``hash_block_tokens`` (``vllm/v1/core/kv_cache_utils.py``): a full block of
``block_size`` tokens is named by a chained hash, so two blocks share a name exactly when the
whole prefix up to and including them is the same token sequence under the same extra keys::

    root      = sha256("trtpipe-prefix-v1" | build_hash | cache_salt)
    hash[0]   = sha256(root    | token_ids[0 : bs])
    hash[i]   = sha256(hash[i-1] | token_ids[i*bs : (i+1)*bs])

``build_hash`` names the artifact (weights, graphs, precision, block size): KV computed by one
build never serves another. ``cache_salt`` is per request (tenant isolation, as vLLM's
``cache_salt``): a request only hits blocks computed under the same salt. Token ids are packed as
little-endian int64, so the hash is the same in every process and on every platform (Python's
``hash()`` is salted per process and would be neither stable nor collision-resistant).

Only full blocks get a hash; the partly filled last block of a sequence is never shared.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trtpipe.runtime.kv.cache_manager import KVCacheManager

_DOMAIN = b"trtpipe-prefix-v1"


def root_hash(build_hash: str, cache_salt: str | None = None) -> bytes:
    """The chain's seed for one artifact and one salt (32 bytes).

    ``cache_salt=None`` and ``""`` are the same (no salt). The fields are length-prefixed, so
    ("ab", "c") and ("a", "bc") differ.
    """
    h = hashlib.sha256(_DOMAIN)
    for part in (build_hash, cache_salt or ""):
        data = part.encode("utf-8")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.digest()


def hash_block_tokens(parent_hash: bytes, token_ids: Sequence[int]) -> bytes:
    """sha256 of the parent block's hash and this block's token ids (int64 little-endian)."""
    packed = array("q", token_ids)  # C long long: 8 bytes on every platform we support
    if sys.byteorder == "big":  # pragma: no cover - no big-endian host here
        packed.byteswap()
    return hashlib.sha256(parent_hash + packed.tobytes()).digest()


def extend_block_hashes(
    block_hashes: list[bytes], token_ids: Sequence[int], block_size: int, root: bytes
) -> list[bytes]:
    """Append the hashes of the full blocks of ``token_ids`` not hashed yet; returns the list.

    ``block_hashes`` holds the hashes of blocks ``0 .. len-1`` of the same token sequence (tokens
    are only ever appended, so earlier hashes stay valid).
    """
    num_full = len(token_ids) // block_size
    parent = block_hashes[-1] if block_hashes else root
    for i in range(len(block_hashes), num_full):
        parent = hash_block_tokens(parent, token_ids[i * block_size : (i + 1) * block_size])
        block_hashes.append(parent)
    return block_hashes


class PrefixCache:
    """The prefix cache of one KV manager and one build: names full blocks by chained hashes and
    finds or offers them (``enabled`` False: every lookup misses and nothing is offered).

    ``root``: the chain's seed per salt (:func:`root_hash`), so KV of another build or tenant
    never matches.
    """

    def __init__(self, kv_manager: KVCacheManager, build_hash: str, enabled: bool):
        self.kv_manager = kv_manager
        self.build_hash = build_hash
        self.enabled = bool(enabled)

    def cached_prefix(self, token_ids: Sequence[int], block_hashes: list[bytes], cache_salt: str | None) -> list[int]:
        """Block ids of the longest cached prefix of a sequence's ``token_ids`` (``block_hashes``:
        its hashes so far, extended here). Capped at ``(num_tokens - 1) // block_size`` blocks: the
        last token is always computed (its logits give the next token). [] when disabled."""
        if not self.enabled:
            return []
        bs = self.kv_manager.block_size
        extend_block_hashes(block_hashes, token_ids, bs, root_hash(self.build_hash, cache_salt))
        return self.kv_manager.find_cached_prefix(block_hashes[: (len(token_ids) - 1) // bs])

    def offer_full_blocks(
        self,
        seq_id: object,
        token_ids: Sequence[int],
        block_hashes: list[bytes],
        num_computed_tokens: int,
        cache_salt: str | None,
    ) -> None:
        """Offer the blocks of ``seq_id`` that became full (KV computed for ``num_computed_tokens``
        of its ``token_ids``) to the cache."""
        if not self.enabled:
            return
        bs = self.kv_manager.block_size
        if len(block_hashes) < num_computed_tokens // bs:
            extend_block_hashes(block_hashes, token_ids, bs, root_hash(self.build_hash, cache_salt))
        self.kv_manager.cache_full_blocks(seq_id, block_hashes, num_computed_tokens)


__all__ = ["PrefixCache", "extend_block_hashes", "hash_block_tokens", "root_hash"]
