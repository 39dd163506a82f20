"""Rewrites of a safetensors file that keep its tensors but move their data,
for the tests of what a load maps and what it copies."""

import json
import struct


def _read(path):
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
        return header, f.read()


def _write(path, header, data):
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 64)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def rewrite_in_reverse_order(path):
    """The same tensors, each still 64-byte aligned, their data in the reverse
    order: a stack's layers from last to first, so that they are not one span."""
    header, data = _read(path)
    metadata = header.pop("__metadata__", None)
    chunks, offset = [], 0
    for name in sorted(header, key=lambda n: -header[n]["data_offsets"][0]):
        begin, end = header[name]["data_offsets"]
        assert (end - begin) % 64 == 0, name
        chunks.append(data[begin:end])
        header[name]["data_offsets"] = [offset, offset + end - begin]
        offset += end - begin
    if metadata is not None:
        header = {"__metadata__": metadata, **header}
    _write(path, header, b"".join(chunks))


def rewrite_with_8_byte_padding(path):
    """The same tensors, their data starting 8 bytes past a 64-byte boundary (as
    the safetensors library may pad), so that no tensor can be mapped."""
    header, data = _read(path)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((-(8 + len(text)) % 64) + 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)
