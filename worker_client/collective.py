"""Dense all-reduce among workers: a two-phase exchange over gRPC.

HET's hybrid communication (section 4, after Parallax) leaves the PS links to
the embeddings and sums dense gradients among the workers. With N workers and
a gradient of S floats cut into N parts, worker p owns part p:

1. reduce-scatter: every worker sends part p of its gradient to worker p;
2. all-gather: worker p adds the N copies of part p in worker order and sends
   the sum to every other worker.

Each link carries about 2 (N-1)/N S floats each way, as a ring all-reduce
does, in two rounds of parallel sends instead of 2 (N-1) sequential ones
(latency matters more than bandwidth for a dense MLP of tens of KB). Each part
is summed once, by its owner, in a fixed order, so every worker ends with the
same bits and their replicas stay equal.

A worker's Collective service carries independent all-reduces, one per
*stream*, each with its own mailbox, size and rounds: stream 0 sums the dense
gradient (round = iteration), stream 1 the batch-norm statistics
(:class:`BatchSums`, several rounds per iteration, each one exchange of whole
vectors: they are a few KB, and one round of messages waits less than two).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Mapping
from concurrent import futures
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt

from heraldps.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
    error_from_rpc,
)
from heraldps.ports import NO_REUSEPORT
from heraldps.security import OPEN, PLAIN, ClientSecurity, ServerSecurity, open_channel
from heraldps.serving import channel_options
from heraldps.status import unary_handler
from heraldps.v1 import collective_pb2, collective_pb2_grpc

Floats = npt.NDArray[np.float32]

REDUCE_SCATTER, ALL_GATHER, EXCHANGE = 0, 1, 2
DENSE_STREAM, STATISTICS_STREAM = 0, 1
MAX_PENDING_ROUNDS = 2  # a peer can be at most one round ahead of this worker


def part_edges(size: int, workers: int) -> list[int]:
    """Boundaries of the N parts of an S-float gradient (parts differ by at most one)."""
    return [size * p // workers for p in range(workers + 1)]


class Mailbox:
    """Parts delivered by peers, kept until this worker's all-reduce takes them.

    Checks what a peer may send: a known sender, the part that phase routes to
    this worker, the part's exact size, finite values, a round this worker has
    not finished, and no more than :data:`MAX_PENDING_ROUNDS` rounds at once.
    """

    def __init__(self, rank: int, workers: int, size: int) -> None:
        self.rank, self.workers = rank, workers
        self.edges = part_edges(size, workers)
        self.finished_round: int | None = None  # the last round this worker completed
        self._parts: dict[tuple[int, int, int], Floats] = {}  # (round, phase, sender)
        self._changed = threading.Condition()

    def _part_size(self, part: int) -> int:
        return self.edges[part + 1] - self.edges[part]

    def put(self, round_: int, phase: int, sender: int, part: int, data: bytes) -> None:
        if phase not in (REDUCE_SCATTER, ALL_GATHER, EXCHANGE):
            raise InvalidArgument(
                f"phase must be 0 (reduce-scatter), 1 (all-gather) or 2 (exchange): {phase}"
            )
        if not 0 <= sender < self.workers or sender == self.rank:
            raise InvalidArgument(f"sender {sender} is not a peer of worker {self.rank}")
        expected = self.rank if phase == REDUCE_SCATTER else sender
        if part != expected:
            raise InvalidArgument(f"phase {phase} from worker {sender} must carry part {expected}")
        size = self.edges[-1] if phase == EXCHANGE else self._part_size(part)
        if len(data) != 4 * size:
            raise InvalidArgument(f"part {part} has {size} floats, got {len(data)} bytes")
        values = np.frombuffer(data, dtype="<f4").astype(np.float32)
        if not np.all(np.isfinite(values)):
            raise InvalidArgument(f"part {part} from worker {sender} has NaN or infinite values")
        key = (round_, phase, sender)
        with self._changed:
            if self.finished_round is not None and round_ <= self.finished_round:
                raise FailedPrecondition(
                    f"round {round_} is over on worker {self.rank} (it finished round "
                    f"{self.finished_round}); the sender is behind"
                )
            rounds = {r for r, _, _ in self._parts} | {round_}
            if len(rounds) > MAX_PENDING_ROUNDS:
                raise ResourceExhausted(
                    f"worker {self.rank} holds parts of rounds {sorted(rounds)[:-1]} already; "
                    "a peer is too far ahead"
                )
            held = self._parts.get(key)
            if held is not None and not np.array_equal(held, values):
                raise FailedPrecondition(
                    f"worker {sender} sent two different phase-{phase} parts for round {round_}"
                )
            self._parts[key] = values
            self._changed.notify_all()

    def take(self, round_: int, phase: int, senders: list[int], timeout: float) -> list[Floats]:
        """The parts of ``senders`` (in that order), waiting up to ``timeout`` seconds."""
        keys = [(round_, phase, s) for s in senders]
        with self._changed:
            if not self._changed.wait_for(lambda: all(k in self._parts for k in keys), timeout):
                missing = [s for s, k in zip(senders, keys, strict=True) if k not in self._parts]
                raise DeadlineExceeded(
                    f"worker {self.rank}: no phase-{phase} part of round {round_} from workers "
                    f"{missing} within {timeout:g} s (is a worker down or slow?)"
                )
            return [self._parts.pop(k) for k in keys]

    def finish(self, round_: int) -> None:
        with self._changed:
            self.finished_round = round_


class CollectiveServicer(collective_pb2_grpc.CollectiveServicer):
    """Stores delivered parts in the mailbox of their stream."""

    def __init__(self, mailboxes: Mailbox | Mapping[int, Mailbox]) -> None:
        self.mailboxes = (
            {DENSE_STREAM: mailboxes} if isinstance(mailboxes, Mailbox) else dict(mailboxes)
        )

    def record_rpc(self, method: str, code: grpc.StatusCode, seconds: float) -> None:
        """Delivery is timed by the sender (the all-reduce's phase); nothing to record here."""

    @unary_handler
    def Deliver(
        self, request: collective_pb2.CollectivePart, context: grpc.ServicerContext
    ) -> collective_pb2.DeliverResponse:
        mailbox = self.mailboxes.get(request.stream)
        if mailbox is None:
            raise InvalidArgument(
                f"this worker runs no all-reduce of stream {request.stream} (it has "
                f"{sorted(self.mailboxes)}): the workers run different jobs"
            )
        mailbox.put(request.round, request.phase, request.sender, request.part,
                    request.values)  # fmt: skip
        return collective_pb2.DeliverResponse()


class AllReduce:
    """Sums one float32 vector of ``size`` over all workers, the same bits on each.

    ``exchange``: one round instead of two, for vectors too small for bytes to matter (batch
    norm's statistics): every worker sends its whole vector to every other and adds the N
    vectors in worker order itself; the same inputs in the same order give the same bits.
    """

    def __init__(
        self,
        rank: int,
        peers: list[str],
        size: int,
        mailbox: Mailbox,
        timeout: float,
        max_message_bytes: int,
        security: ClientSecurity = PLAIN,
        stream: int = DENSE_STREAM,
        exchange: bool = False,
    ) -> None:
        self.rank, self.workers, self.size = rank, len(peers), size
        self.stream, self.exchange = stream, exchange
        self.mailbox = mailbox
        self.timeout = timeout
        self.edges = part_edges(size, self.workers)
        self._channels = {
            w: open_channel(address, channel_options(max_message_bytes), security)
            for w, address in enumerate(peers)
            if w != rank
        }
        self._stubs = {w: collective_pb2_grpc.CollectiveStub(c) for w, c in self._channels.items()}
        self._peer_addresses = peers
        self.bytes_moved = 0  # payload bytes sent and received, all rounds
        self.wait_seconds = 0.0  # blocked on peers' parts, all rounds

    def _part(self, values: Floats, part: int) -> Floats:
        return values[self.edges[part] : self.edges[part + 1]]

    def _send(self, round_: int, phase: int, parts: dict[int, Floats]) -> None:
        """Deliver ``parts[w]`` to worker ``w`` for every ``w``, in parallel; wait for all."""
        calls: list[tuple[int, Any]] = []  # grpc futures
        for w, values in parts.items():
            message = collective_pb2.CollectivePart(
                round=round_, phase=phase, sender=self.rank,
                part=w if phase == REDUCE_SCATTER else self.rank,
                values=values.astype("<f4").tobytes(), stream=self.stream,
            )  # fmt: skip
            calls.append((w, self._stubs[w].Deliver.future(message, timeout=self.timeout)))
            self.bytes_moved += 4 * values.shape[0]
        for w, call in calls:
            try:
                call.result()
            except grpc.RpcError as err:
                raise error_from_rpc(err, self._peer_addresses[w]) from None

    def _take(self, round_: int, phase: int, senders: list[int]) -> list[Floats]:
        started = time.perf_counter()
        try:
            return self.mailbox.take(round_, phase, senders, self.timeout)
        finally:
            self.wait_seconds += time.perf_counter() - started

    def sum(self, values: Floats, round_: int) -> Floats:
        """The elementwise sum of every worker's ``values`` for round ``round_``."""
        values = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
        if values.shape[0] != self.size:
            raise InvalidArgument(f"all-reduce of {self.size} floats got {values.shape[0]}")
        if self.workers == 1:
            return values.copy()
        others = [w for w in range(self.workers) if w != self.rank]
        if self.exchange:
            return self._exchange(values, round_, others)
        self._send(round_, REDUCE_SCATTER, {w: self._part(values, w) for w in others})
        received = self._take(round_, REDUCE_SCATTER, others)
        copies = dict(zip(others, received, strict=True))
        copies[self.rank] = self._part(values, self.rank)
        mine = copies[0].copy()
        for w in range(1, self.workers):  # worker order: the same sum on every worker
            mine += copies[w]
        self._send(round_, ALL_GATHER, dict.fromkeys(others, mine))
        gathered = self._take(round_, ALL_GATHER, others)
        self.mailbox.finish(round_)
        out = np.empty(self.size, dtype=np.float32)
        for w, part in zip(others, gathered, strict=True):
            out[self.edges[w] : self.edges[w + 1]] = part
        out[self.edges[self.rank] : self.edges[self.rank + 1]] = mine
        self.bytes_moved += 4 * sum(p.shape[0] for p in received) + 4 * sum(
            p.shape[0] for p in gathered
        )
        return out

    def _exchange(self, values: Floats, round_: int, others: list[int]) -> Floats:
        """One round: the whole vector to every peer, the N vectors added in worker order."""
        self._send(round_, EXCHANGE, dict.fromkeys(others, values))
        received = self._take(round_, EXCHANGE, others)
        self.mailbox.finish(round_)
        copies = dict(zip(others, received, strict=True))
        copies[self.rank] = values
        out = copies[0].copy()
        for w in range(1, self.workers):
            out += copies[w]
        self.bytes_moved += 4 * sum(p.shape[0] for p in received)
        return out

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()


def serve_collective(
    mailbox: Mailbox | Mapping[int, Mailbox],
    host: str,
    port: int,
    max_message_bytes: int,
    security: ServerSecurity = OPEN,
) -> tuple[grpc.Server, int]:
    """Start the worker's Collective service on ``host:port`` (0: a free port), delivering
    to ``mailbox`` (stream 0) or to a mailbox per stream; ``security``: TLS and the token
    peers must present (the workers' own)."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="collective"),
        options=channel_options(max_message_bytes) + NO_REUSEPORT,
        interceptors=security.interceptors(()),
    )
    collective_pb2_grpc.add_CollectiveServicer_to_server(CollectiveServicer(mailbox), server)
    bound = security.bind(server, host, port, "the worker's all-reduce server", "--collective-port")
    server.start()
    return server, bound


class BatchSums:
    """The batch-norm statistics' all-reduce: sums the small vectors of
    :func:`heraldps.batch_norm.reduce` over the workers of each global batch.

    One :class:`AllReduce` of the model's largest reduction (stream 1); a shorter vector
    is padded with zeros. Round ``iteration x per_step + k`` is the k-th reduction of the
    iteration's step, so rounds only grow, as the mailbox requires, and never meet the
    dense gradient's (another stream). Every worker calls it the same number of times per
    step, also one with no samples (it sends zeros).
    """

    def __init__(self, all_reduce: AllReduce, per_step: int) -> None:
        self.all_reduce, self.per_step = all_reduce, per_step

    def for_iteration(self, iteration: int) -> Callable[[Floats], Floats]:
        """The ``batch_sum`` of iteration ``iteration``'s training step."""
        calls = itertools.count()

        def batch_sum(values: Floats) -> Floats:
            k = next(calls)
            if k >= self.per_step:
                raise FailedPrecondition(
                    f"reduction {k + 1} of iteration {iteration}: a step makes {self.per_step}"
                )
            values = np.asarray(values, dtype=np.float32).reshape(-1)
            padded = np.zeros(self.all_reduce.size, np.float32)
            padded[: values.shape[0]] = values
            total = self.all_reduce.sum(padded, iteration * self.per_step + k)
            return total[: values.shape[0]]

        return batch_sum

    def close(self) -> None:
        self.all_reduce.close()
