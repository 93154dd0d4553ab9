"""DeepFM (Guo et al., 2017) written once over an array module ``xp``.

The same code runs on NumPy (CPU) and CuPy (GPU): it only uses array methods
both share, and the one NumPy-only operation it needs, an unbuffered
scatter-add, goes through :func:`scatter_add`. Every array is float32 and
every scalar is cast to float32, so nothing silently upcasts to float64.

The model never owns its parameters. The embedding rows a mini-batch uses
live in the worker's cache and are passed in as ``emb``; the dense (MLP,
linear and bias) parameters are one flat float32 vector that the PS stores
as a single dense table and the worker passes in as ``dense_params``. Both
gradients come back in the same shapes, ready to push.
"""

from __future__ import annotations

import importlib
import itertools
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from heraldps.activations import activation_named
from heraldps.arrays import to_host
from heraldps.dropout import dropout_mask
from heraldps.errors import InvalidArgument
from heraldps.jit import njit

f32 = np.float32


@njit(nogil=True)
def _add_rows(out: Any, index: Any, values: Any) -> None:  # pragma: no cover - compiled
    """``np.add.at(out, index, values)`` for rows: the same float32 additions in the same
    order (index order), so the same sums bit for bit, 25x faster than ``add.at``."""
    rows = out.shape[0]
    for i in range(index.shape[0]):
        r = index[i]
        if r < 0 or r >= rows:
            raise IndexError("scatter_add: an index is out of range of the rows")
        for j in range(values.shape[1]):
            out[r, j] += values[i, j]


def scatter_add(xp: Any, out: Any, index: Any, values: Any) -> None:
    """``out[index] += values`` with repeated indices accumulating (unbuffered).

    Plain ``out[index] += values`` keeps only one of the updates of a repeated
    index. NumPy and CuPy >= 13 spell the unbuffered form ``add.at`` (CuPy 14 deprecates
    its older ``cupyx.scatter_add``, which CuPy 12 still needs); a test double is asked
    for ``add.at`` too. Float32 rows on NumPy (the embedding gradient) take a compiled
    loop that adds in ``add.at``'s order.
    """
    if (xp is np and out.ndim == 2 and index.ndim == 1
            and values.shape == (index.shape[0], out.shape[1])
            and out.dtype == values.dtype == np.float32):  # fmt: skip
        _add_rows(out, index.astype(np.int64, copy=False), values)
        return
    add_at = getattr(xp.add, "at", None)
    if add_at is not None:
        add_at(out, index, values)
    else:  # CuPy 12: imported lazily (optional dependency, no type stubs)
        cupyx: Any = importlib.import_module("cupyx")
        cupyx.scatter_add(out, index, values)


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a DeepFM model; everything needed to lay out its dense parameters."""

    num_fields: int  # sparse (categorical) fields per sample, e.g. 26 for Criteo
    num_dense: int  # dense numeric features per sample, e.g. 13 for Criteo, 0 for Avazu
    embedding_dim: int = 8
    hidden: tuple[int, ...] = (64, 32)
    seed: int = 0
    activation: str = "relu"  # of the hidden layers: a name in heraldps.activations
    dropout: float = 0.0  # rate on every hidden layer's output in training (0: off)

    def __post_init__(self) -> None:
        if self.num_fields < 1:
            raise InvalidArgument(
                "num_fields must be at least 1 (the dataset's sparse columns), "
                f"got {self.num_fields}"
            )
        if self.num_dense < 0:
            raise InvalidArgument(
                f"num_dense must be 0 or more (the dataset's dense columns), got {self.num_dense}"
            )
        if self.embedding_dim < 1:
            raise InvalidArgument(
                f"embedding_dim must be at least 1, got {self.embedding_dim}; e.g. use 8"
            )
        bad = [h for h in self.hidden if h < 1]
        if bad:
            raise InvalidArgument(
                f"every hidden layer size must be at least 1, got {self.hidden}; "
                "use e.g. (64, 32), or () for no hidden layer"
            )
        activation_named(self.activation)  # a registered name, or the error that lists them
        if not 0.0 <= self.dropout < 1.0:
            raise InvalidArgument(f"dropout must be in [0, 1), got {self.dropout}; e.g. 0.1")


class DenseParams(NamedTuple):
    """Views into the flat dense vector (no copies): one ``(W, b)`` per MLP layer."""

    layers: list[tuple[Any, Any]]  # W [in, out], b [out]; the last layer has out == 1
    w_lin: Any  # [num_dense]
    bias: Any  # [1]


class DeepFM:
    """DeepFM: logit = FM second-order term + MLP + linear(dense features) + bias.

    Dense parameter layout, in this order in one flat float32 vector:

    1. for each MLP layer ``l`` (the hidden layers, then the output layer of
       width 1), with ``in_0 = num_fields * embedding_dim + num_dense`` and
       ``in_l`` the previous layer's width: ``W_l`` as ``[in_l, out_l]``
       row-major, then ``b_l`` as ``[out_l]``;
    2. ``w_lin`` ``[num_dense]``: the linear term on the dense features;
    3. ``bias`` ``[1]``.

    The MLP input of a sample is its field embeddings in field order, then its
    dense features: ``concat(x_emb[0], ..., x_emb[F-1], dense_x)``.
    """

    def __init__(self, config: ModelConfig, xp: Any = np) -> None:
        self.config = config
        self.xp = xp
        self.activation = activation_named(config.activation)
        c = config
        widths = [c.num_fields * c.embedding_dim + c.num_dense, *c.hidden, 1]
        # (offset, shape) of every tensor, in layout order.
        self._layout: list[tuple[int, tuple[int, ...]]] = []
        offset = 0
        for fan_in, fan_out in itertools.pairwise(widths):
            for shape in ((fan_in, fan_out), (fan_out,)):
                self._layout.append((offset, shape))
                offset += int(np.prod(shape))
        for shape in ((c.num_dense,), (1,)):
            self._layout.append((offset, shape))
            offset += int(np.prod(shape))
        self._dense_size = offset

    @property
    def dense_size(self) -> int:
        """Number of float32 dense parameters (the length of ``dense_params``)."""
        return self._dense_size

    def init_dense(self) -> npt.NDArray[np.float32]:
        """Initial dense vector, deterministic from ``config.seed`` (host NumPy).

        He-uniform for hidden layers that feed a ReLU (or leaky ReLU), Glorot-uniform
        for the others and for the output layer, zeros for biases and for the linear term.
        """
        rng = np.random.default_rng(self.config.seed)
        out = np.zeros(self._dense_size, dtype=np.float32)
        num_layers = len(self.config.hidden) + 1
        for layer in range(num_layers):
            offset, (fan_in, fan_out) = self._layout[2 * layer]
            if layer < num_layers - 1 and self.activation.he_init:
                limit = np.sqrt(6.0 / fan_in)
            else:
                limit = np.sqrt(6.0 / (fan_in + fan_out))
            weights = rng.uniform(-limit, limit, size=fan_in * fan_out)
            out[offset : offset + fan_in * fan_out] = weights.astype(np.float32)
        return out

    def unpack(self, dense_params: Any) -> DenseParams:
        """Views of ``dense_params`` (or of a gradient of the same layout) per tensor."""
        if dense_params.ndim != 1 or dense_params.shape[0] != self._dense_size:
            raise InvalidArgument(
                f"dense_params must be a flat vector of {self._dense_size} values for this "
                f"model, got shape {tuple(dense_params.shape)}; "
                "pull the dense table created from this ModelConfig"
            )
        views = [dense_params[o : o + int(np.prod(s))].reshape(s) for o, s in self._layout]
        layers = [(views[i], views[i + 1]) for i in range(0, len(views) - 2, 2)]
        return DenseParams(layers, views[-2], views[-1])

    # ----- forward / backward -------------------------------------------------
    def _inputs(
        self, dense_params: Any, emb: Any, field_rows: Any, dense_x: Any
    ) -> tuple[Any, Any, Any, Any]:
        """Inputs as float32/int64 xp arrays (no copy when they already are), shape-checked.

        Only shapes are checked: checking values would synchronise with the device.
        """
        xp = self.xp
        dense_params = xp.asarray(dense_params, dtype=np.float32)
        emb = xp.asarray(emb, dtype=np.float32)
        field_rows = xp.asarray(field_rows, dtype=np.int64)
        dense_x = xp.asarray(dense_x, dtype=np.float32)
        c = self.config
        if emb.ndim != 2 or emb.shape[1] != c.embedding_dim:
            raise InvalidArgument(
                f"emb must be [rows, {c.embedding_dim}], got shape {tuple(emb.shape)}"
            )
        if field_rows.ndim != 2 or field_rows.shape[1] != c.num_fields:
            raise InvalidArgument(
                f"field_rows must be [batch, {c.num_fields}], got shape {tuple(field_rows.shape)}"
            )
        batch = field_rows.shape[0]
        if dense_x.shape != (batch, c.num_dense):
            raise InvalidArgument(
                f"dense_x must be [{batch}, {c.num_dense}] (batch, num_dense), "
                f"got shape {tuple(dense_x.shape)}"
            )
        return dense_params, emb, field_rows, dense_x

    def _forward(
        self,
        params: DenseParams,
        emb: Any,
        field_rows: Any,
        dense_x: Any,
        sample_ids: Any = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Logits ``[B]`` and what the backward pass needs. With ``sample_ids`` (training
        with dropout), each hidden layer's output is masked by :func:`dropout_mask`."""
        xp = self.xp
        B, F = field_rows.shape
        D = self.config.embedding_dim
        present = field_rows >= 0
        # -1 reads row 0 and is then zeroed: no negative index may wrap to the last row.
        rows = xp.where(present, field_rows, 0)
        if emb.shape[0] > 0:
            x = emb[rows] * present[:, :, None].astype(np.float32)
        else:  # every field missing: there is nothing to gather from
            x = xp.zeros((B, F, D), dtype=np.float32)
        s = x.sum(axis=1)  # [B, D]
        fm = f32(0.5) * (s * s - (x * x).sum(axis=1)).sum(axis=1)
        h = xp.concatenate([x.reshape(B, F * D), dense_x], axis=1)
        inputs, pre, acts, masks = [h], [], [], []
        for layer, (W, b) in enumerate(params.layers[:-1]):
            z = h @ W + b
            pre.append(z)
            h = self.activation.forward(xp, z)
            acts.append(h)
            if sample_ids is not None:
                c = self.config
                mask = dropout_mask(xp, c.dropout, c.seed, layer, sample_ids, z.shape[1])
                masks.append(mask)
                h = h * mask
            inputs.append(h)
        W_out, b_out = params.layers[-1]
        deep = (h @ W_out + b_out)[:, 0]
        logit = fm + deep + dense_x @ params.w_lin + params.bias[0]
        cache = {"present": present, "rows": rows, "x": x, "s": s, "inputs": inputs, "pre": pre,
                 "acts": acts, "masks": masks}  # fmt: skip
        return logit, cache

    def forward_backward(
        self,
        dense_params: Any,
        emb: Any,
        field_rows: Any,
        dense_x: Any,
        labels: Any,
        loss_scale: float,
        sample_ids: Any = None,
    ) -> tuple[float, Any, Any]:
        """``(loss_sum, emb_grad, dense_grad)`` of one mini-batch.

        ``loss_sum`` is the summed binary cross-entropy of the batch; the
        gradients are of ``loss_sum / loss_scale``. Callers pass the global
        batch size as ``loss_scale`` so that the gradients of the workers'
        mini-batches add up to the gradient of the global batch's mean loss.
        ``emb_grad[r]`` sums over every (sample, field) that uses row ``r``;
        missing fields (-1) contribute nothing. ``sample_ids`` (int64 ``[B]``, the
        samples' global indices: iteration x global batch + index in the global batch)
        draw the dropout masks; required when ``config.dropout > 0``, else unused.
        """
        xp = self.xp
        if not loss_scale > 0:
            raise InvalidArgument(
                f"loss_scale must be positive (the global batch size), got {loss_scale}"
            )
        dense_params, emb, field_rows, dense_x = self._inputs(
            dense_params, emb, field_rows, dense_x
        )
        labels = xp.asarray(labels, dtype=np.float32)
        B, F = field_rows.shape
        D = self.config.embedding_dim
        if labels.shape != (B,):
            raise InvalidArgument(f"labels must be [{B}], got shape {tuple(labels.shape)}")
        params = self.unpack(dense_params)
        if self.config.dropout > 0:
            if sample_ids is None:
                raise InvalidArgument(
                    "this model trains with dropout: pass sample_ids (each sample's global "
                    "index), from which the masks are drawn"
                )
            sample_ids = xp.asarray(sample_ids, dtype=np.int64)
            if sample_ids.shape != (B,):
                raise InvalidArgument(
                    f"sample_ids must be [{B}], got shape {tuple(sample_ids.shape)}"
                )
        else:
            sample_ids = None
        logit, cache = self._forward(params, emb, field_rows, dense_x, sample_ids)

        # Stable BCE from logits: max(z, 0) - z*y + log(1 + exp(-|z|)).
        e = xp.exp(-xp.abs(logit))
        loss = xp.maximum(logit, f32(0)) - logit * labels + xp.log1p(e)
        loss_sum = float(to_host(loss.sum(dtype=np.float64)))  # one explicit transfer
        prob = xp.where(logit >= 0, f32(1) / (f32(1) + e), e / (f32(1) + e))
        dlogit = (prob - labels) / f32(loss_scale)  # [B]

        grad = xp.zeros(self._dense_size, dtype=np.float32)
        g = self.unpack(grad)
        g.bias[0] = dlogit.sum()
        g.w_lin[...] = dense_x.T @ dlogit
        # MLP, output layer first.
        dh = dlogit[:, None]  # d loss / d (layer output)
        inputs, pre, acts, masks = cache["inputs"], cache["pre"], cache["acts"], cache["masks"]
        for layer in range(len(params.layers) - 1, -1, -1):
            W = params.layers[layer][0]
            dW, db = g.layers[layer]
            if layer < len(params.layers) - 1:
                if masks:  # through the dropout mask
                    dh = dh * masks[layer]
                dh = dh * self.activation.grad(xp, pre[layer], acts[layer])  # and activation
            dW[...] = inputs[layer].T @ dh
            db[...] = dh.sum(axis=0)
            dh = dh @ W.T
        dx = dh[:, : F * D].reshape(B, F, D)
        # FM: d/dx_f of 0.5 * (|sum_g x_g|^2 - sum_g |x_g|^2) is (sum_g x_g) - x_f.
        dx = dx + dlogit[:, None, None] * (cache["s"][:, None, :] - cache["x"])
        dx = dx * cache["present"][:, :, None].astype(np.float32)

        emb_grad = xp.zeros(emb.shape, dtype=np.float32)
        if emb.shape[0] > 0:
            # Missing fields point at row 0 with a zero gradient: adding it is harmless
            # and avoids a data-dependent (device-synchronising) boolean selection.
            scatter_add(xp, emb_grad, cache["rows"].reshape(-1), dx.reshape(B * F, D))
        return loss_sum, emb_grad, grad

    def predict(self, dense_params: Any, emb: Any, field_rows: Any, dense_x: Any) -> Any:
        """Click probabilities ``[B]`` (float32, on the array module's device)."""
        xp = self.xp
        dense_params, emb, field_rows, dense_x = self._inputs(
            dense_params, emb, field_rows, dense_x
        )
        logit, _ = self._forward(self.unpack(dense_params), emb, field_rows, dense_x)
        e = xp.exp(-xp.abs(logit))
        return xp.where(logit >= 0, f32(1) / (f32(1) + e), e / (f32(1) + e))
