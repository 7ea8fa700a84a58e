"""A connection's HPACK header blocks, decoded with the `hpack` library, and decoded once when they
come again unchanged.

Every block is decoded while the peer changes the dynamic table, since later blocks refer to it; a
block that leaves the table as it was means the same fields each time it comes again, until the
table changes. Envoy sends the same block (indexed fields, literals not indexed) for every stream,
so most are decoded once per connection.
"""

from __future__ import annotations

from hpack import Decoder
from hpack.exceptions import HPACKError

from epick.wire.h2 import HEADER_LIST_BYTES, MAX_CACHED_BLOCKS, H2ConnectionError, H2Error


class HeaderBlocks:
    def __init__(self) -> None:
        self._decoder = Decoder()
        self._decoder.max_header_list_size = HEADER_LIST_BYTES
        self._blocks: dict[bytes, dict[str, str]] = {}  # decoded while the table stayed as it is

    def decode(self, block: bytes) -> dict[str, str]:
        """The block's fields (a dict of its own); an undecodable block is a COMPRESSION_ERROR."""
        cached = self._blocks.get(block)
        if cached is not None:
            return dict(cached)
        table = self._decoder.header_table
        entries = table.dynamic_entries
        count, newest, size = len(entries), entries[0] if entries else None, table.maxsize
        try:
            fields = self._decoder.decode(block)
        except HPACKError as e:
            raise H2ConnectionError(H2Error.COMPRESSION_ERROR, f"an undecodable header block ({e})") from None
        headers = {str(k): str(v) for k, v in fields}
        # An entry added is a new tuple at the front (even when it equals the one before).
        if len(entries) == count and table.maxsize == size and (entries[0] if entries else None) is newest:
            if len(self._blocks) >= MAX_CACHED_BLOCKS:
                self._blocks.clear()
            self._blocks[block] = headers
        else:
            self._blocks.clear()
        return dict(headers)
