"""Typed fields: what a field's bytes are (its type descriptor, SPEC.md §6.5), how a value
becomes them when written and how they become a value again when read.

==================  ==========================================  ===============================
value written       descriptor                                  read back as
==================  ==========================================  ===============================
bytes-like          ``bytes``                                   ``bytes``
``str``             ``str``                                     ``str``
dict, list, float,  ``json``                                    the JSON value (a tuple comes
bool, None                                                      back as a list)
``int``             ``int`` (8 bytes, signed)                   ``int``
numpy array         ``ndarray:DTYPE:SHAPE`` (C order,           a read-only numpy array over
                    little-endian)                              the bytes read (no copy)
any array           ``npy`` (declared: one ``.npy`` per value)  a numpy array
encoded image       ``image:CODEC`` (declared; bytes, or a      ``bytes``; a PIL image with
(bytes or PIL)      PIL image encoded as CODEC)                 ``images="pil"``
==================  ==========================================  ===============================

numpy is needed only for arrays, PIL only for images given or read as PIL images. Reading with
``raw=True`` gives the stored bytes of every field instead.
"""

import io
import json
import struct

DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64")


def _numpy():
    try:
        import numpy
    except ImportError as e:  # pragma: no cover - numpy is in every test environment
        raise ImportError("numpy is needed for array fields (pip install numpy)") from e
    return numpy


def _has_numpy():
    import sys
    return "numpy" in sys.modules


IMAGES = ("bytes", "pil")


def check_images(images):
    """``images`` as a reader's option: how image fields are read."""
    if images not in IMAGES:
        raise ValueError(f"images must be one of {', '.join(IMAGES)}, not {images!r}")
    return images


def asked(descriptor, raw=False, images="bytes"):
    """The descriptor a reader decodes a field by: ``bytes`` with ``raw``; an image's with
    ``:pil`` appended when PIL images are asked for (a reader's own, never stored)."""
    if raw:
        return "bytes"
    if images == "pil" and descriptor.startswith("image:"):
        return descriptor + ":pil"
    return descriptor


def _pil():
    try:
        from PIL import Image
    except ImportError as e:
        raise ImportError("PIL is needed for images read or written as PIL images "
                          "(pip install pillow)") from e
    return Image


def _bytes_like(value, what):
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{what}: a bytes-like value is needed here, not {type(value).__name__}")


def infer(value, what):
    """The descriptor a value is stored with when its field declares none."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bytes"
    if isinstance(value, str):
        return "str"
    if isinstance(value, bool) or value is None or isinstance(value, (float, dict, list, tuple)):
        return "json"
    if isinstance(value, int):
        return "int"
    if _has_numpy():
        np = _numpy()
        if isinstance(value, np.ndarray):
            name = value.dtype.name
            if name not in DTYPES:
                raise TypeError(
                    f"{what}: arrays of {name} are not a field type; declare the field "
                    f"'npy' (schema={{...: 'npy'}}) to store any array")
            return f"ndarray:{name}:{','.join(str(d) for d in value.shape)}"
        if isinstance(value, np.bool_):
            return "json"
        if isinstance(value, np.integer):
            return "int"
        if isinstance(value, np.floating):
            return "json"
    if hasattr(value, "__array__"):  # a torch tensor, for one
        return infer(_numpy().asarray(value), what)
    raise TypeError(
        f"{what}: {type(value).__name__} is not a field value (bytes, str, int, float, bool, "
        f"None, dict, list or a numpy array)")


def encode(value, descriptor, what):
    """The bytes that store ``value`` as ``descriptor``; a TypeError or ValueError naming
    ``what`` when it does not fit."""
    kind, _, rest = descriptor.partition(":")
    if kind == "image" and not isinstance(value, (bytes, bytearray, memoryview)):
        image = _pil()
        if not isinstance(value, image.Image):
            raise TypeError(f"{what}: an image field takes encoded bytes or a PIL image, not "
                            f"{type(value).__name__}")
        buf = io.BytesIO()
        value.save(buf, format="JPEG" if rest == "jpg" else rest.upper())
        return buf.getvalue()
    if kind in ("bytes", "image"):
        return _bytes_like(value, what)
    if kind == "str":
        if isinstance(value, str):
            return value.encode("utf-8")
        b = _bytes_like(value, what)
        b.decode("utf-8")
        return b
    if kind == "json":
        if _has_numpy():
            np = _numpy()
            if isinstance(value, (np.generic,)):
                value = value.item()
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    if kind == "int":
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            raise TypeError(f"{what}: an int is needed for an int field, not {type(value).__name__}")
        v = value.__index__()
        if not -(1 << 63) <= v < (1 << 63):
            raise ValueError(f"{what}: {v} does not fit an int field (64 bits, signed)")
        return struct.pack("<q", v)
    np = _numpy()
    arr = np.asarray(value)
    if kind == "npy":
        buf = io.BytesIO()
        np.save(buf, arr, allow_pickle=False)
        return buf.getvalue()
    if kind == "ndarray":
        dtype, _, shape = rest.partition(":")
        want = tuple(int(d) for d in shape.split(",")) if shape else ()
        if arr.dtype.name != dtype or arr.shape != want:
            raise ValueError(
                f"{what}: an array of {arr.dtype.name} {arr.shape} in a field of "
                f"{dtype} {want}; declare the field 'npy' (schema={{...: 'npy'}}) for arrays "
                f"of several shapes or types")
        little = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
        return np.ascontiguousarray(little).tobytes()
    raise ValueError(f"{what}: unknown field type {descriptor!r}")


def decode(data, descriptor):
    """The value stored as ``data`` (bytes, or a buffer) with ``descriptor``."""
    kind, _, rest = descriptor.partition(":")
    if kind == "image" and rest.endswith(":pil"):
        img = _pil().open(io.BytesIO(bytes(data)))
        img.load()
        return img
    if kind in ("bytes", "image"):
        return data
    if kind == "str":
        return bytes(data).decode("utf-8")
    if kind == "json":
        return json.loads(bytes(data))
    if kind == "int":
        return struct.unpack("<q", bytes(data))[0]
    np = _numpy()
    if kind == "npy":
        return np.load(io.BytesIO(bytes(data)), allow_pickle=False)
    if kind == "ndarray":
        dtype, _, shape = rest.partition(":")
        want = tuple(int(d) for d in shape.split(",")) if shape else ()
        return np.frombuffer(data, dtype=np.dtype(dtype).newbyteorder("<")).reshape(want)
    return data


def decode_fields(fields, types):
    """``{name: value}`` of ``{name: stored bytes}`` by the fields' ``types``."""
    return {n: decode(v, types.get(n, "bytes")) if v is not None else None
            for n, v in fields.items()}


def stack(values, descriptor):
    """A batch's values of one field: stacked into one array when the field is a fixed-shape
    array and every sample has it; the list otherwise."""
    if descriptor.startswith("ndarray:") and values and all(v is not None for v in values):
        return _numpy().stack(values)
    return values


def _buffer(view):
    """A buffer over a batch's view of a field's bytes (a torch tensor, a numpy array, bytes)."""
    if hasattr(view, "numpy"):
        return view.numpy()
    return view


def batch_fields(data, layouts, wanted=None):
    """``{name: [each sample's value, or None]}`` of a batch's per-sample payloads ``data`` and
    their field layouts ``[(name, offset, length, type)]``; a fixed-shape array field every
    sample has becomes one stacked array."""
    names = {}
    for lay in layouts:
        for n, _, _, t in lay:
            if wanted is None or n in wanted:
                names.setdefault(n, t)
    out = {n: [None] * len(layouts) for n in sorted(names)}
    for j, lay in enumerate(layouts):
        for n, o, k, t in lay:
            if n in out:
                piece = data[j][o:o + k]
                out[n][j] = piece if t == "bytes" else decode(_buffer(piece), t)
    return {n: stack(v, names[n]) for n, v in out.items()}
