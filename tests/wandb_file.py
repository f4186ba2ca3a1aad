"""Read the records of a W&B offline run file (run-*.wandb): the W&B header, then LevelDB's log format
(32 KiB blocks; each chunk = crc32 u32, length u16, type u8), each record a wandb_internal_pb2.Record.
Lets tests check what the real wandb library wrote (group, tags, config, history, summary)."""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Dict, List

from wandb.proto import wandb_internal_pb2 as pb

BLOCK = 32 * 1024
HEADER = 7      # ":W&B" + magic u16 + version u8
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> List[pb.Record]:
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", "not a W&B run file"
    out, pos, pending = [], HEADER, b""
    while pos + 7 <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < 7:          # trailer padding
            pos += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(pending)
            out.append(record)
    return out


def digest(path: Path) -> Dict:
    """run metadata, config keys, history rows (as dicts of JSON strings) and the last summary update."""
    out: Dict = {"run": None, "config": {}, "history": [], "summary": {}}
    for r in records(path):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            out["run"] = r.run
            out["config"].update({i.key: i.value_json for i in r.run.config.update})
        elif kind == "config":
            out["config"].update({i.key: i.value_json for i in r.config.update})
        elif kind == "history":
            out["history"].append({(i.key or "/".join(i.nested_key)): i.value_json for i in r.history.item})
        elif kind == "summary":
            out["summary"].update({(i.key or "/".join(i.nested_key)): i.value_json for i in r.summary.update})
    return out
