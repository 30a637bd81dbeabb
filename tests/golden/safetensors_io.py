#!/usr/bin/python3
"""Minimal safetensors reader/writer (written by hand: no safetensors package).

Layout of a file:
  bytes 0..7   little-endian uint64 N, the length of the JSON header
  bytes 8..8+N JSON object: {"<name>": {"dtype": "F32", "shape": [...],
               "data_offsets": [begin, end]}, ..., "__metadata__": {str: str}}
               (padded with trailing spaces so the data starts 8-byte aligned)
  then         the raw little-endian tensor bytes; offsets are relative to the
               first byte after the header.

Supported dtypes: F32, F64, I32, I64, F16 and BF16. numpy has no bfloat16, so
BF16 tensors travel as their raw 16-bit patterns: written from
`t.view(torch.int16)` and read back into an int16 array viewed as
torch.bfloat16 (bit-exact both ways). F16 goes through numpy's float16.
Tensors are written in the order given (the C++ reader must not rely on it).
"""
import json
import struct

import numpy as np
import torch

_TORCH_TO_ST = {torch.float32: "F32", torch.float64: "F64", torch.int32: "I32", torch.int64: "I64",
                torch.float16: "F16", torch.bfloat16: "BF16"}
# BF16 is carried by numpy as int16 bit patterns (see the module docstring).
_ST_TO_NUMPY = {"F32": "<f4", "F64": "<f8", "I32": "<i4", "I64": "<i8", "F16": "<f2", "BF16": "<i2"}


def _tensor_bytes(t, dtype):
    """The little-endian bytes of `t` stored as safetensors dtype `dtype`."""
    t = t.detach().cpu().contiguous()
    if dtype == "BF16":
        arr = t.view(torch.int16).numpy()
    else:
        arr = t.numpy()
    return np.ascontiguousarray(arr.astype(_ST_TO_NUMPY[dtype], copy=False)).tobytes()


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
        data = _tensor_bytes(t, dtype)
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
        dtype = info["dtype"]
        if dtype not in _ST_TO_NUMPY:
            raise ValueError(f"[safetensors] {path}: {name}: unsupported dtype {dtype}")
        arr = np.frombuffer(raw[base + begin:base + end], dtype=_ST_TO_NUMPY[dtype])
        t = torch.from_numpy(arr.copy().reshape(info["shape"]))
        out[name] = t.view(torch.bfloat16) if dtype == "BF16" else t
    return out, metadata
