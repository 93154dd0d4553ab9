"""Atomic bit clears for compiled loops that share 64-bit masks between threads.

The scheduler keeps one bit per worker in a per-key word (which workers cache a
key, hold it validly, used it lately). Its eviction pass runs two groups of
workers on two threads, and two of them may clear their own bits of the same
key's word at once. A plain ``word &= ~bit`` is a load and a store, so one
thread's clear could undo the other's; ``atomic_and(array, i, mask)`` is one
locked instruction (LLVM's ``atomicrmw and``, monotonic ordering: each word's
updates are never lost; no order between different words is implied, none is
needed). It returns the word as it was, so of two threads clearing the last two bits
exactly one sees the word become zero. Uncontended, it costs a few nanoseconds more than
the plain store.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


def _atomic_and_typing(  # pragma: no cover
    typingctx: Any, array: Any, index: Any, mask: Any
) -> Any:
    """Typing and code generation of :data:`atomic_and` (1-D arrays of 64-bit ints)."""
    if not (
        isinstance(array, types.Array)
        and array.ndim == 1
        and isinstance(array.dtype, types.Integer)
        and getattr(array.dtype, "bitwidth", 0) == 64
        and isinstance(index, types.Integer)
        and isinstance(mask, types.Integer)
    ):
        return None
    sig = array.dtype(array, index, mask)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        array_type = signature.args[0]
        view = context.make_array(array_type)(context, builder, args[0])
        position = context.cast(builder, args[1], signature.args[1], types.intp)
        value = context.cast(builder, args[2], signature.args[2], array_type.dtype)
        address = cgutils.get_item_pointer(  # type: ignore[no-untyped-call]
            context, builder, array_type, view, [position], wraparound=False
        )
        return builder.atomic_rmw("and", address, value, "monotonic")

    return sig, codegen


atomic_and = cast(Callable[[Any, Any, Any], Any], intrinsic(_atomic_and_typing))
"""``atomic_and(array, i, mask)`` in compiled code: ``array[i] &= mask`` as one atomic
operation, returning the value before (``array``: a 1-D int64 or uint64 array)."""
