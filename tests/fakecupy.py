"""A test-only array module that behaves like CuPy where GPU bugs hide.

No machine of this project has a GPU, so the worker's CuPy path is tested
through this module instead. Its arrays live "on the device": like CuPy's
device arrays they refuse every implicit conversion to host memory, and this
module is stricter than CuPy where CuPy converts silently:

- ``np.asarray(x)``, ``float(x)``, ``int(x)``, ``bool(x)``, iterating,
  ``x.tolist()``, ``x.item()`` raise ``TypeError``;
- a NumPy array as an operand, an index or an assigned value raises too (CuPy
  would copy it to the device implicitly), so every host-to-device copy is
  an explicit ``asarray``.

The two explicit transfers are counted in :data:`transfers`: ``asarray`` /
``array`` of host data is one ``to_device``; ``asnumpy(x)`` / ``x.get()`` is one
``to_host``. The arithmetic itself is NumPy's, so results equal NumPy's bit
for bit and an exactness test through this module checks the code path, not
the GPU's arithmetic.
"""

from __future__ import annotations

import collections
import operator
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

transfers: collections.Counter[str] = collections.Counter()

_SCALARS = (bool, int, float, np.generic)


def reset() -> None:
    """Zero the transfer counts."""
    transfers.clear()


def _refuse(what: str) -> TypeError:
    return TypeError(
        f"implicit conversion of a device array ({what}) is not allowed; transfer it "
        "explicitly with asnumpy(x) or x.get()"
    )


def _unwrap(value: Any, what: str) -> Any:
    """The NumPy array behind a device array; scalars pass; host arrays are refused."""
    if isinstance(value, ndarray):
        return value._data
    if isinstance(value, _SCALARS) or value is None:
        return value
    if isinstance(value, np.ndarray):
        raise TypeError(
            f"a host NumPy array used as {what} of a device operation; copy it to the "
            "device first with asarray()"
        )
    if isinstance(value, list | tuple):
        return type(value)(_unwrap(v, what) for v in value)
    if isinstance(value, slice) or value is Ellipsis:
        return value
    raise TypeError(f"unsupported {what}: {type(value).__name__}")


def _wrap(value: Any) -> Any:
    return ndarray(value) if isinstance(value, np.ndarray) else value


def _binary(op: Callable[[Any, Any], Any], reflected: bool = False) -> Callable[..., Any]:
    def method(self: ndarray, other: Any) -> Any:
        other = _unwrap(other, "an operand")
        result = op(other, self._data) if reflected else op(self._data, other)
        return _wrap(result)

    return method


def _inplace(op: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    def method(self: ndarray, other: Any) -> ndarray:
        op(self._data, _unwrap(other, "an operand"))
        return self

    return method


class ndarray:  # noqa: N801 - named like cupy.ndarray
    """A device array: NumPy storage, no implicit way back to the host."""

    __array_ufunc__ = None  # NumPy defers to our reflected operators instead of converting

    def __init__(self, data: np.ndarray) -> None:
        self._data = data

    # ----- what CuPy refuses (or this double refuses more strictly) ------------------
    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise _refuse("np.asarray")

    def __float__(self) -> float:
        raise _refuse("float()")

    def __int__(self) -> int:
        raise _refuse("int()")

    def __index__(self) -> int:
        raise _refuse("an index")

    def __bool__(self) -> bool:
        raise _refuse("bool()")

    def __iter__(self) -> Any:
        raise _refuse("iteration")

    def tolist(self) -> Any:
        raise _refuse("tolist()")

    def item(self) -> Any:
        raise _refuse("item()")

    # ----- the explicit transfer back -------------------------------------------------
    def get(self) -> np.ndarray:
        """Device -> host copy (counted)."""
        transfers["to_host"] += 1
        return self._data.copy()

    # ----- array protocol -------------------------------------------------------------
    def __array_namespace__(self, api_version: str | None = None) -> Any:
        return sys.modules[__name__]

    @property
    def shape(self) -> tuple[int, ...]:
        return self._data.shape

    @property
    def ndim(self) -> int:
        return self._data.ndim

    @property
    def dtype(self) -> np.dtype[Any]:
        return self._data.dtype

    @property
    def size(self) -> int:
        return self._data.size

    @property
    def T(self) -> ndarray:
        return ndarray(self._data.T)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"fakecupy.ndarray(shape={self.shape}, dtype={self.dtype})"

    def reshape(self, *shape: Any) -> ndarray:
        return ndarray(self._data.reshape(*shape))

    def astype(self, dtype: Any, copy: bool = True) -> ndarray:
        return ndarray(self._data.astype(dtype, copy=copy))

    def copy(self) -> ndarray:
        return ndarray(self._data.copy())

    def sum(self, axis: Any = None, dtype: Any = None) -> ndarray:
        return ndarray(np.asarray(self._data.sum(axis=axis, dtype=dtype)))

    def __getitem__(self, key: Any) -> ndarray:
        return ndarray(np.asarray(self._data[_unwrap(key, "an index")]))

    def __setitem__(self, key: Any, value: Any) -> None:
        self._data[_unwrap(key, "an index")] = _unwrap(value, "an assigned value")

    __add__ = _binary(operator.add)
    __radd__ = _binary(operator.add, reflected=True)
    __sub__ = _binary(operator.sub)
    __rsub__ = _binary(operator.sub, reflected=True)
    __mul__ = _binary(operator.mul)
    __rmul__ = _binary(operator.mul, reflected=True)
    __truediv__ = _binary(operator.truediv)
    __rtruediv__ = _binary(operator.truediv, reflected=True)
    __matmul__ = _binary(operator.matmul)
    __rmatmul__ = _binary(operator.matmul, reflected=True)
    __pow__ = _binary(operator.pow)
    __rpow__ = _binary(operator.pow, reflected=True)
    __lt__ = _binary(operator.lt)
    __le__ = _binary(operator.le)
    __gt__ = _binary(operator.gt)
    __ge__ = _binary(operator.ge)
    __eq__ = _binary(operator.eq)  # type: ignore[assignment]
    __ne__ = _binary(operator.ne)  # type: ignore[assignment]
    __and__ = _binary(operator.and_)
    __or__ = _binary(operator.or_)
    __xor__ = _binary(operator.xor)
    __rshift__ = _binary(operator.rshift)
    __iadd__ = _inplace(operator.iadd)
    __isub__ = _inplace(operator.isub)
    __imul__ = _inplace(operator.imul)
    __itruediv__ = _inplace(operator.itruediv)

    def __neg__(self) -> ndarray:
        return ndarray(-self._data)

    def __invert__(self) -> ndarray:
        return ndarray(~self._data)

    def __abs__(self) -> ndarray:
        return ndarray(np.abs(self._data))


# ----- module functions -------------------------------------------------------------
float32 = np.float32
float64 = np.float64
int64 = np.int64
bool_ = np.bool_


def asarray(value: Any, dtype: Any = None) -> ndarray:
    """A device array: host data is copied to the device (counted), device data is not."""
    if isinstance(value, ndarray):
        return value if dtype is None else value.astype(dtype, copy=False)
    transfers["to_device"] += 1
    return ndarray(np.array(value, dtype=dtype))


array = asarray


def asnumpy(value: ndarray) -> np.ndarray:
    """Device -> host copy (counted)."""
    return value.get()


def _creation(make: Callable[..., np.ndarray]) -> Callable[..., ndarray]:
    def create(*args: Any, **kwargs: Any) -> ndarray:
        return ndarray(make(*args, **kwargs))

    return create


zeros = _creation(np.zeros)
ones = _creation(np.ones)
empty = _creation(np.empty)
full = _creation(np.full)
arange = _creation(np.arange)


def _elementwise(function: Callable[..., Any]) -> Callable[..., Any]:
    def apply(*args: Any, **kwargs: Any) -> Any:
        unwrapped = [_unwrap(a, "an argument") for a in args]
        return _wrap(np.asarray(function(*unwrapped, **kwargs)))

    return apply


where = _elementwise(np.where)
maximum = _elementwise(np.maximum)
minimum = _elementwise(np.minimum)
exp = _elementwise(np.exp)
log = _elementwise(np.log)
log1p = _elementwise(np.log1p)
abs = _elementwise(np.abs)
sqrt = _elementwise(np.sqrt)
tanh = _elementwise(np.tanh)
power = _elementwise(np.power)
isfinite = _elementwise(np.isfinite)


def concatenate(arrays: Any, axis: int = 0) -> ndarray:
    return ndarray(np.concatenate([_unwrap(a, "an argument") for a in arrays], axis=axis))


class _Add:
    """``add.at(out, index, values)``: unbuffered scatter-add on the device."""

    def __call__(self, a: Any, b: Any) -> Any:
        return _wrap(np.add(_unwrap(a, "an operand"), _unwrap(b, "an operand")))

    def at(self, out: ndarray, index: Any, values: Any) -> None:
        np.add.at(out._data, _unwrap(index, "an index"), _unwrap(values, "a value"))


add = _Add()
