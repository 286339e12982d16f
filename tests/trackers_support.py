"""Helpers shared by unit/test_trackers.py and e2e/test_trackers_runs.py."""
import importlib.util
import json
import struct
from pathlib import Path

import pytest


needs_wandb = pytest.mark.skipif(importlib.util.find_spec("wandb") is None,
                                 reason="wandb is not installed (pip install wandb)")


# ---------------------------------------------------------------- reading the libraries' offline run files
def read_record_log(path: Path) -> list:
    """The records of a wandb ``.wandb`` / SwanLab ``.swanlab`` file. Both use LevelDB's log format after a 7-byte
    file header: 32 KiB blocks of records, each ``crc32 (4) | length (2) | type (1) | data``, a record split across
    blocks as FIRST (2), MIDDLE (3)..., LAST (4); a block tail shorter than a record header is zero padding."""
    data, records, pending = path.read_bytes(), [], b""
    position, block = 7, 32768
    while position + 7 <= len(data):
        if block - position % block < 7:
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position:position + 7])
        chunk = data[position + 7:position + 7 + length]
        position += 7 + length
        if kind == 0 and length == 0:  # zero fill after the last record
            break
        pending += chunk
        if kind in (1, 4):  # FULL or LAST
            records.append(pending)
            pending = b""
    return records


def wandb_run(folder: Path) -> dict:
    """history {step: {key: value}}, config {key: value} and run id of one offline wandb run folder."""
    from wandb.proto import wandb_internal_pb2

    history, config, run_id = {}, {}, None
    for raw in read_record_log(next(folder.glob("run-*.wandb"))):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run_id = record.run.run_id
            config.update({item.key: json.loads(item.value_json) for item in record.run.config.update})
        elif kind == "config":
            config.update({item.key: json.loads(item.value_json) for item in record.config.update})
        elif kind == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            history.setdefault(row["_step"], {}).update(row)
    return {"history": history, "config": config, "id": run_id}


def wandb_run_when_written(folder: Path, last_step: int, seconds: float = 30.0) -> dict:
    """:func:`wandb_run` once the record log holds the run record and ``last_step``: wandb's service process writes
    the log on its own, and on a busy machine ``finish()`` returned before it had (seen for both the first and the
    resumed run, about 1 CI run in 10). Returns what was read at the deadline otherwise, for the test to report."""
    import time

    deadline = time.monotonic() + seconds
    run = wandb_run(folder)
    while (run["id"] is None or last_step not in run["history"]) and time.monotonic() < deadline:
        time.sleep(0.5)
        run = wandb_run(folder)
    return run
