"""Rows of a table (Parquet, Spark, Ray) as granary samples: which columns are the key, the
data or the named fields, and the label; shared by ``from_parquet``, ``granary.spark`` and
``granary.ray``."""


class Columns:
    """Which columns make a sample. ``key``: a column of str/bytes keys (None: keys are the
    row numbers, ``prefix`` + zero-padded). Exactly one of ``data`` (a bytes column: one blob per
    sample) and ``fields`` (a list of columns, each a field named after it, or a dict
    {field name: column}). ``label``: an int or str column, or None."""

    def __init__(self, key=None, data=None, fields=None, label=None, prefix=""):
        if (data is None) == (fields is None):
            raise ValueError("give exactly one of data= (a column of bytes) and fields= "
                             "(columns that become named fields)")
        if fields is not None:
            if isinstance(fields, str):
                fields = [fields]
            if isinstance(fields, dict):
                fields = dict(fields)
            else:
                fields = {c: c for c in fields}
            if not fields:
                raise ValueError("fields= names no column")
        self.key, self.data, self.fields, self.label, self.prefix = key, data, fields, label, prefix

    def names(self):
        """Every column read."""
        cols = [self.data] if self.data is not None else list(self.fields.values())
        return [c for c in [self.key, *cols, self.label] if c is not None]

    def check_arrow_schema(self, schema, where):
        """Refuses columns that are missing or of a type that cannot be a key, a field or a
        label, naming the column and its type."""
        import pyarrow as pa

        def kind(col):
            try:
                return schema.field(col).type
            except KeyError:
                raise ValueError(f"{where}: no column {col!r} (columns: {', '.join(schema.names)})") from None

        def bytes_like(t):
            if pa.types.is_struct(t):  # Hugging Face images: {"bytes": binary, "path": string}
                return any(t.field(i).name == "bytes" and bytes_like(t.field(i).type)
                           for i in range(t.num_fields))
            return (pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_string(t)
                    or pa.types.is_large_string(t) or pa.types.is_fixed_size_binary(t))

        if self.key is not None:
            t = kind(self.key)
            if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
                    or pa.types.is_integer(t)):
                raise ValueError(f"{where}: key column {self.key!r} is {t}; keys are str, bytes or ints")
        cols = [self.data] if self.data is not None else list(self.fields.values())
        for c in cols:
            t = kind(c)
            if not bytes_like(t):
                raise ValueError(f"{where}: column {c!r} is {t}; data and fields come from binary or "
                                 "string columns (or image structs with a 'bytes' member)")
        if self.label is not None:
            t = kind(self.label)
            if not (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)):
                raise ValueError(f"{where}: label column {self.label!r} is {t}; labels are ints or strings")

    def sample(self, row, number):
        """(key, data, label) of a row given as a mapping of column -> value."""
        key = row[self.key] if self.key is not None else f"{self.prefix}{number:09d}"
        if isinstance(key, int) and not isinstance(key, bool):
            key = f"{key:09d}"
        if self.data is not None:
            data = _bytes(row[self.data], self.data)
        else:
            data = {}
            for name, col in self.fields.items():
                v = row[col]
                if v is not None:  # a null cell: the sample lacks that field
                    data[name] = _bytes(v, col)
        label = row[self.label] if self.label is not None else None
        return key, data, label


def _bytes(v, col):
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    if isinstance(v, str):
        return v.encode("utf-8")
    if isinstance(v, dict) and "bytes" in v:  # a Hugging Face image cell
        return _bytes(v["bytes"], col)
    if hasattr(v, "asDict"):  # a Spark Row (struct)
        return _bytes(v.asDict(), col)
    if v is None:
        raise ValueError(f"column {col!r} holds a null where a sample's data belongs")
    raise TypeError(f"column {col!r} holds {type(v).__name__}; expected bytes or str")


def label_classes(values):
    """The class table for labels that are all ints (names "0".."max") or all strings
    (sorted), and None when there are no labels."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return [str(i) for i in range(max(values) + 1)]
    if all(isinstance(v, str) for v in values):
        return sorted(set(values))
    raise ValueError("labels are ints and strings mixed; use one kind")
