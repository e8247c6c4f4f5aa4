"""Writes messages as SGLang publishes them (`--kv-events-config`), for kv-events' tests.

SGLang does not run on this project's machines, so its messages are made here with its own
wire layout: msgspec structs, `array_like=True` and tagged, as in
`sglang/srt/disaggregation/kv_events.py` (the layout restated below, field order included).
Run with any Python that has msgspec (the vLLM venv does):

    $VENV/bin/python kv-events/tests/data/sglang_messages.py kv-events/tests/data/sglang
"""

import os
import sys
from typing import Any, Optional, Union

import msgspec


class EventBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[Any]
    attn_dp_rank: Optional[int] = None


class KVCacheEvent(msgspec.Struct, array_like=True, gc=False, tag=True):
    pass


class BlockStoredMetadata(msgspec.Struct, omit_defaults=True, gc=False):
    cache_salt: str


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: Optional[int]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str] = None


class BlockStoredWithMetadata(BlockStored, tag="BlockStored", kw_only=True):
    metadata: BlockStoredMetadata


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: Optional[str] = None


class AllBlocksCleared(KVCacheEvent):
    pass


def main() -> None:
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    enc = msgspec.msgpack.Encoder()
    # SGLang's radix cache pages are often 1 token; here 4, under a router block of 8 tokens
    batches = [
        EventBatch(ts=1.0, events=[
            BlockStored(block_hashes=[11, 12], parent_block_hash=None,
                        token_ids=list(range(100, 108)), block_size=4, lora_id=None, medium="GPU"),
            BlockStored(block_hashes=[13, 14], parent_block_hash=12,
                        token_ids=list(range(108, 116)), block_size=4, lora_id=None, medium="GPU"),
        ], attn_dp_rank=0),
        EventBatch(ts=2.0, events=[
            BlockStoredWithMetadata(block_hashes=[21, 22], parent_block_hash=None,
                                    token_ids=list(range(100, 108)), block_size=4, lora_id=None,
                                    medium="GPU", metadata=BlockStoredMetadata(cache_salt="tenant-a")),
            # a copy in host memory (HiCache): not the pod's own cache
            BlockStored(block_hashes=[31, 32], parent_block_hash=None,
                        token_ids=list(range(200, 208)), block_size=4, lora_id=None, medium="CPU_PINNED"),
        ]),
        EventBatch(ts=3.0, events=[BlockRemoved(block_hashes=[14], medium="GPU")]),
        EventBatch(ts=4.0, events=[AllBlocksCleared()]),
    ]
    for seq, batch in enumerate(batches):
        with open(os.path.join(out, f"{seq:03}.payload"), "wb") as f:
            f.write(enc.encode(batch))


if __name__ == "__main__":
    main()
