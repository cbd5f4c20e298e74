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
    from trtpipe.runtime.kv_manager import KVCacheManager
    from trtpipe.runtime.request import Request

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


def cached_prefix_blocks(kv_manager: KVCacheManager, request: Request, build_hash: str) -> list[int]:
    """Block ids of the longest cached prefix of ``request``'s tokens (hashing the blocks not
    hashed yet). Capped at ``(num_tokens - 1) // block_size`` blocks: the last token is always
    computed (its logits give the next token)."""
    bs = kv_manager.block_size
    tokens = request.all_token_ids
    extend_block_hashes(request.block_hashes, tokens, bs, root_hash(build_hash, request.cache_salt))
    return kv_manager.find_cached_prefix(request.block_hashes[: (len(tokens) - 1) // bs])


def offer_full_blocks(kv_manager: KVCacheManager, request: Request, build_hash: str) -> None:
    """Offer ``request``'s blocks that became full (KV computed) to the prefix cache."""
    bs = kv_manager.block_size
    if len(request.block_hashes) < request.num_computed_tokens // bs:
        extend_block_hashes(request.block_hashes, request.all_token_ids, bs, root_hash(build_hash, request.cache_salt))
    kv_manager.cache_full_blocks(request.request_id, request.block_hashes, request.num_computed_tokens)


__all__ = ["cached_prefix_blocks", "extend_block_hashes", "hash_block_tokens", "offer_full_blocks", "root_hash"]
