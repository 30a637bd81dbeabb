#!/usr/bin/python3
"""Minimal safetensors reader/writer (written by hand: no safetensors package).

Layout of a file:
  bytes 0..7   little-endian uint64 N, the length of the JSON header
  bytes 8..8+N JSON object: {"<name>": {"dtype": "F32", "shape": [...],
               "data_offsets": [begin, end]}, ..., "__metadata__": {str: str}}
               (padded with trailing spaces so the data starts 8-byte aligned)
  then         the raw little-endian tensor bytes; offsets are relative to the
               first byte after the header.

Only the dtypes the golden files use are supported: F32, F64, I32, I64.
Tensors are written in the order given (the C++ reader must not rely on it).
"""
import json
import struct

import numpy as np
import torch

_TORCH_TO_ST = {torch.float32: "F32", torch.float64: "F64", torch.int32: "I32", torch.int64: "I64"}
_ST_TO_NUMPY = {"F32": "<f4", "F64": "<f8", "I32": "<i4", "I64": "<i8"}


def write_safetensors(path, tensors, metadata=None):
    """Writes `tensors` (name -> torch.Tensor, insertion order kept) to `path`.

    `metadata` is a dict of str -> str stored under "__metadata__".
    """
    header = {}
    blobs = []
    offset = 0
    for name, t in tensors.items():
        if t.dtype not in _TORCH_TO_ST:
            raise ValueError(f"[safetensors] {name}: unsupported dtype {t.dtype}")
        dtype = _TORCH_TO_ST[t.dtype]
        data = np.ascontiguousarray(t.detach().cpu().numpy().astype(_ST_TO_NUMPY[dtype], copy=False)).tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise ValueError("[safetensors] __metadata__ must map str to str")
        header["__metadata__"] = dict(metadata)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    """Returns (tensors: dict name -> torch.Tensor, metadata: dict)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    metadata = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        arr = np.frombuffer(raw[base + begin:base + end], dtype=_ST_TO_NUMPY[info["dtype"]])
        out[name] = torch.from_numpy(arr.copy().reshape(info["shape"]))
    return out, metadata
