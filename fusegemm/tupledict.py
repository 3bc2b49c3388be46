"""``TupleDict``: the result type of every fusegemm op and reference.

cuDNN frontend's wrappers return a ``TupleDict``: a ``dict`` whose keys name the outputs and whose
*iteration yields the values* in key order, so both ``d, c = result`` and ``result["d_tensor"]``
work. Ours keeps that contract (it is a ``dict`` subclass, so ``isinstance(result, dict)`` holds)
and adds two things: integer indexing accepts negative indices like a tuple, and the mapping is
read-only, because a result whose key order could change after construction would unpack
differently from what its docstring promised.
"""
from __future__ import annotations

from typing import Any, Iterator, NoReturn

__all__ = ["TupleDict"]


def _summary(value: Any) -> str:
    """Short description of one value for ``repr``: arrays and tensors by shape and dtype."""
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        kind = type(value).__module__.split(".")[0]
        name = "tensor" if kind == "torch" else "array"
        dtype_name = str(dtype).removeprefix("torch.")
        return f"{name}(shape={tuple(shape)}, dtype={dtype_name})"
    return repr(value)


class TupleDict(dict):
    """Ordered, read-only mapping that also unpacks and indexes like a tuple.

    Parameters
    ----------
    *args, **kwargs
        As for ``dict``. Keys must be strings; their insertion order is the tuple order.

    Notes
    -----
    Iterating a ``TupleDict`` yields its **values** (that is what makes ``d, c = result`` work),
    while ``in``, ``keys()``, ``values()``, ``items()`` and ``len()`` behave as for a ``dict``.
    ``result[i]`` with an ``int`` returns the i-th value (negative indices count from the end);
    ``result["name"]`` returns the value stored under that key.

    Examples
    --------
    >>> result = TupleDict(d_tensor=1, c_tensor=None)
    >>> d, c = result
    >>> result[0] == result["d_tensor"] == d == 1
    True
    >>> list(result.keys())
    ['d_tensor', 'c_tensor']
    """

    __slots__ = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for key in dict.keys(self):
            if not isinstance(key, str):
                raise TypeError(
                    f"TupleDict keys must be str; got key {key!r} of type {type(key).__name__}"
                )

    @classmethod
    def of(cls, **kwargs: Any) -> "TupleDict":
        """Like ``TupleDict(**kwargs)`` without the key check (keyword names are str already);
        the ops' host fast path builds its results with it."""
        out = cls.__new__(cls)
        dict.update(out, kwargs)
        return out

    def __iter__(self) -> Iterator[Any]:
        return iter(dict.values(self))

    def __getitem__(self, key: str | int) -> Any:
        if isinstance(key, bool) or not isinstance(key, (str, int)):
            raise TypeError(
                f"TupleDict index must be a str key or an int position; got {key!r} "
                f"of type {type(key).__name__}"
            )
        if isinstance(key, int):
            keys = list(dict.keys(self))
            if not -len(keys) <= key < len(keys):
                raise IndexError(
                    f"TupleDict index {key} out of range for {len(keys)} items "
                    f"(allowed: {-len(keys)} to {len(keys) - 1})"
                )
            return dict.__getitem__(self, keys[key])
        return dict.__getitem__(self, key)

    def __repr__(self) -> str:
        body = ", ".join(f"{k}={_summary(v)}" for k, v in dict.items(self))
        return f"TupleDict({body})"

    def __reduce__(self) -> tuple[type, tuple[list[tuple[str, Any]]]]:
        # dict's default pickling replays __setitem__, which is disabled here.
        return (type(self), (list(dict.items(self)),))

    def _read_only(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("TupleDict is read-only: build a new one instead of modifying it")

    __setitem__ = _read_only
    __delitem__ = _read_only
    __ior__ = _read_only  # type: ignore[assignment]
    clear = _read_only
    pop = _read_only
    popitem = _read_only
    setdefault = _read_only
    update = _read_only
