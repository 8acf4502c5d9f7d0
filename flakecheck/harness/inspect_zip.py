"""inspect_ai's `.eval` log without inspect_ai: a zip of JSON members (header.json; samples/<id>_epoch_<n>.json;
summaries, reductions, and _journal/ while the eval runs). inspect_ai 0.3.285 compresses the members with
zstd (zip method 93), which Python's zipfile reads only from 3.14 on; pyarrow's zstd codec decompresses them
here, from the member's raw bytes."""

from __future__ import annotations

import json
import struct
import zipfile
import zlib
from pathlib import Path
from typing import Any

from flakecheck.errors import InputError

ZSTD = 93
_LOCAL_HEADER = 30  # bytes before a member's name in its local file header


def read_eval_zip(path: Path) -> dict[str, Any]:
    """The log as one dict in the .json log's shape: header.json's fields plus `samples` (in the order of the
    header's sample ids, epochs ascending). A log whose eval never finished has no header.json: its
    _journal/start.json stands in, with status "started"."""
    name = str(path)
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise InputError(name, None, None, f"not an inspect_ai .eval log (not a zip archive: {exc})") from None
    with archive, path.open("rb") as raw:
        members = {info.filename: info for info in archive.infolist()}
        if "header.json" in members:
            log = _member(archive, raw, members["header.json"], name)
        elif "_journal/start.json" in members:
            log = {**_member(archive, raw, members["_journal/start.json"], name), "status": "started"}
        else:
            raise InputError(name, None, None, "not an inspect_ai .eval log (no header.json in the archive)")
        if not isinstance(log, dict):
            raise InputError(f"{name}:header.json", None, None, "expected a JSON object")
        samples = [_member(archive, raw, info, name) for member, info in members.items()
                   if member.startswith("samples/") and member.endswith(".json")]
    log["samples"] = samples
    return log


def _member(archive: zipfile.ZipFile, raw: Any, info: zipfile.ZipInfo, name: str) -> Any:
    where = f"{name}:{info.filename}"
    try:
        data = _zstd(raw, info) if info.compress_type == ZSTD else archive.read(info)
    except (OSError, zipfile.BadZipFile, NotImplementedError, zlib.error, ValueError, struct.error) as exc:
        raise InputError(where, None, None, f"cannot read this member of the log: {exc}") from None
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(where, getattr(exc, "lineno", None), None, f"malformed JSON: {exc}") from None


def _zstd(raw: Any, info: zipfile.ZipInfo) -> bytes:
    import pyarrow as pa  # here, not above: inspect_log.py is also imported where only inspect_ai is installed

    raw.seek(info.header_offset)
    header = raw.read(_LOCAL_HEADER)
    if len(header) < _LOCAL_HEADER or header[:4] != b"PK\x03\x04":
        raise zipfile.BadZipFile("bad local file header")
    name_length, extra_length = struct.unpack("<HH", header[26:30])
    raw.seek(info.header_offset + _LOCAL_HEADER + name_length + extra_length)
    compressed = raw.read(info.compress_size)
    try:
        return pa.Codec("zstd").decompress(compressed, decompressed_size=info.file_size).to_pybytes()
    except pa.ArrowException as exc:  # corrupt or truncated data: pyarrow's errors are not all OSError/ValueError
        raise zipfile.BadZipFile(f"zstd: {exc}") from None
