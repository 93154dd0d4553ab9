"""A software prefetch for compiled loops that hop around big arrays.

The hash probes and per-key records of the PS index and the scheduler
mirror are random reads into tables of tens of MiB, so nearly every one is a
cache miss. Asking for the line of element ``i + 16`` while working on
element ``i`` overlaps those misses: measured on a 2M-slot ``KeyIndex``
(32 MiB), inserting a batch of 26,624 keys went from 0.64 ms to 0.32 ms.

``prefetch(array, i)`` emits LLVM's ``llvm.prefetch`` (read, keep in all
cache levels) for the address of ``array[i]`` (``array[i, 0]`` for a 2-D
array). It is only a hint: it never faults and changes no value, so an index
past the end is harmless as long as the caller keeps it in bounds of the
allocation (callers here always do).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_READ = 0
_KEEP_IN_ALL_LEVELS = 3
_DATA_CACHE = 1


def _intrinsic_name(pointer: ir.Type) -> str:
    """``llvm.prefetch`` is overloaded on the pointer type: ``p0`` with opaque
    pointers (LLVM >= 15 as numba uses it now), ``p0i8`` with typed ones."""
    return "llvm.prefetch.p0" if str(pointer) == "ptr" else "llvm.prefetch.p0i8"


def _prefetch_typing(typingctx: Any, array: Any, index: Any) -> Any:  # pragma: no cover
    """Typing and code generation of :data:`prefetch`."""
    if not isinstance(array, types.Array) or not isinstance(index, types.Integer):
        return None
    sig = types.void(array, index)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        array_type = signature.args[0]
        view = context.make_array(array_type)(context, builder, args[0])
        position = context.cast(builder, args[1], signature.args[1], types.intp)
        zero = context.get_constant(types.intp, 0)
        indices = [position] + [zero] * (array_type.ndim - 1)
        address = cgutils.get_item_pointer(  # type: ignore[no-untyped-call]
            context, builder, array_type, view, indices, wraparound=False
        )
        byte_pointer = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        function_type = ir.FunctionType(ir.VoidType(), [byte_pointer, i32, i32, i32])
        function = cgutils.get_or_insert_function(  # type: ignore[no-untyped-call]
            builder.module, function_type, _intrinsic_name(byte_pointer)
        )
        builder.call(
            function,
            [
                builder.bitcast(address, byte_pointer),
                ir.Constant(i32, _READ),
                ir.Constant(i32, _KEEP_IN_ALL_LEVELS),
                ir.Constant(i32, _DATA_CACHE),
            ],
        )
        return context.get_dummy_value()

    return sig, codegen


prefetch = cast(Callable[[Any, Any], None], intrinsic(_prefetch_typing))
"""``prefetch(array, i)`` in compiled code: hint the CPU to load the line of
``array[i]`` (row ``i`` of a 2-D array)."""
