"""A minimal ONNX model writer: just enough of ONNX's protobuf schema (`onnx.proto`,
ModelProto and what it holds) to write the graphs of the project's generated models.

Why not the `onnx` package: it is a large native wheel used by nothing else at run time,
and a node writes its generated models offline on first use, so the writer would become a
runtime dependency. The wire format of the few messages needed is small and stable (field
numbers are ONNX's compatibility promise); ONNX Runtime, which loads every file this
writes, is the check (tests/models/test_tiny_piper.py loads and runs it).

It writes; it never parses, and it knows no operator: a graph that makes no sense is
refused by ONNX Runtime when loaded, never here.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

FLOAT, INT64 = 1, 7
"""TensorProto.DataType values this writer uses."""

_DTYPES = {np.dtype(np.float32): FLOAT, np.dtype(np.int64): INT64}

IR_VERSION = 8
"""ONNX IR version written (ONNX 1.10+; every ONNX Runtime since 1.10 reads it)."""

_ATTR_FLOAT, _ATTR_INT, _ATTR_INTS = 1, 2, 7
"""AttributeProto.AttributeType values this writer uses."""


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # protobuf writes negative int64 as ten-byte two's complement
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _tag(number: int, wire_type: int) -> bytes:
    return _varint(number << 3 | wire_type)


def _int(number: int, value: int) -> bytes:
    return _tag(number, 0) + _varint(value)


def _bytes(number: int, value: bytes) -> bytes:
    return _tag(number, 2) + _varint(len(value)) + value


def _str(number: int, value: str) -> bytes:
    return _bytes(number, value.encode("utf-8"))


def _float(number: int, value: float) -> bytes:
    return _tag(number, 5) + struct.pack("<f", value)


@dataclass(frozen=True)
class Node:
    """One operator application (NodeProto). `attributes`: int, float or tuple of ints."""

    op_type: str
    inputs: Sequence[str]
    outputs: Sequence[str]
    attributes: Mapping[str, int | float | tuple[int, ...]] = field(default_factory=dict)

    def encode(self, name: str) -> bytes:
        out = b"".join(_str(1, i) for i in self.inputs) + b"".join(_str(2, o) for o in self.outputs)
        out += _str(3, name) + _str(4, self.op_type)
        for key, value in sorted(self.attributes.items()):
            if isinstance(value, tuple):
                body = _str(1, key) + b"".join(_int(8, v) for v in value) + _int(20, _ATTR_INTS)
            elif isinstance(value, float):
                body = _str(1, key) + _float(2, value) + _int(20, _ATTR_FLOAT)
            else:
                body = _str(1, key) + _int(3, value) + _int(20, _ATTR_INT)
            out += _bytes(5, body)
        return out


@dataclass(frozen=True)
class Value:
    """A graph input or output (ValueInfoProto): a tensor of `elem_type` whose dimensions
    are sizes or symbolic names."""

    name: str
    elem_type: int
    shape: Sequence[int | str]

    def encode(self) -> bytes:
        dims = b"".join(_bytes(1, _int(1, d) if isinstance(d, int) else _str(2, d)) for d in self.shape)
        tensor_type = _int(1, self.elem_type) + _bytes(2, dims)
        return _str(1, self.name) + _bytes(2, _bytes(1, tensor_type))


def tensor(name: str, array: np.ndarray) -> bytes:
    """A TensorProto holding `array` (float32 or int64) little-endian in raw_data."""
    array = np.ascontiguousarray(array)
    elem_type = _DTYPES[array.dtype]
    little = array.astype(array.dtype.newbyteorder("<"), copy=False)
    return b"".join(_int(1, d) for d in array.shape) + _int(2, elem_type) + _str(8, name) + _bytes(9, little.tobytes())


def model(*, graph_name: str, nodes: Sequence[Node], initializers: Mapping[str, np.ndarray],
          inputs: Sequence[Value], outputs: Sequence[Value], opset: int, producer: str) -> bytes:
    """A serialised ModelProto: one graph, the default operator domain at `opset`. Nodes
    are named `<op_type>_<index>`; initializers are written in the order given."""
    graph = b"".join(_bytes(1, node.encode(f"{node.op_type}_{i}")) for i, node in enumerate(nodes))
    graph += _str(2, graph_name)
    graph += b"".join(_bytes(5, tensor(name, array)) for name, array in initializers.items())
    graph += b"".join(_bytes(11, value.encode()) for value in inputs)
    graph += b"".join(_bytes(12, value.encode()) for value in outputs)
    opset_import = _str(1, "") + _int(2, opset)
    return _int(1, IR_VERSION) + _str(2, producer) + _bytes(7, graph) + _bytes(8, opset_import)


__all__ = ["FLOAT", "INT64", "IR_VERSION", "Node", "Value", "model", "tensor"]
