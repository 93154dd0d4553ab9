"""DeepFM (Guo et al., 2017) written once over an array module ``xp``.

The same code runs on NumPy (CPU) and CuPy (GPU): it only uses array methods
both share, and the one NumPy-only operation it needs, an unbuffered
scatter-add, goes through :func:`scatter_add`. Every array is float32 and
every scalar is cast to float32, so nothing silently upcasts to float64
(batch normalization takes its sums in float64 on purpose, with explicit casts).

The model never owns its parameters. The embedding rows a mini-batch uses
live in the worker's cache and are passed in as ``emb``; the dense (MLP,
linear and bias, batch normalization) parameters are one flat float32 vector
that the PS stores as a single dense table and the worker passes in as
``dense_params``. Both gradients come back in the same shapes, ready to push.

Batch normalization (``ModelConfig.batch_norm``) normalizes with the statistics
of the *global* batch, though a worker holds only its share of it: the caller
passes ``batch_sum``, which sums a small float32 vector over every worker of the
global batch (one all-reduce per layer forward and one backward), so every mode
trains the model single-process training on the whole batch does.
"""

from __future__ import annotations

import importlib
import itertools
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from heraldps import batch_norm
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
    batch_norm: bool = False  # normalize every hidden layer's pre-activation (global batch)

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


class BatchNormParams(NamedTuple):
    """One hidden layer's batch normalization: trained ``gamma``, ``beta``, and the running
    statistics prediction uses (buffers: never trained, overwritten after each step)."""

    gamma: Any  # [out]
    beta: Any  # [out]
    running_mean: Any  # [out]
    running_var: Any  # [out]


class DenseParams(NamedTuple):
    """Views into the flat dense vector (no copies): one ``(W, b)`` per MLP layer, and
    one :class:`BatchNormParams` per hidden layer with batch normalization."""

    layers: list[tuple[Any, Any]]  # W [in, out], b [out]; the last layer has out == 1
    w_lin: Any  # [num_dense]
    bias: Any  # [1]
    norms: list[BatchNormParams]  # one per hidden layer with batch_norm, else empty


class RunningStats(NamedTuple):
    """The running statistics after a training step: ``values`` at flat ``positions``
    of the dense vector. They take no gradient; whoever applies the step's dense update
    writes them over the updated vector (:meth:`write_into`), so no optimizer moves them."""

    positions: npt.NDArray[np.int64]
    values: npt.NDArray[np.float32]  # host NumPy

    def write_into(self, dense: npt.NDArray[np.float32]) -> None:
        """Overwrite the running statistics in ``dense``: a flat vector, or the dense table's
        rows (``[rows, width]``, C-contiguous; the flat vector padded), in place."""
        flat = dense.reshape(-1)
        if not np.shares_memory(flat, dense):
            raise InvalidArgument("write_into needs a contiguous array it can change in place")
        flat[self.positions] = self.values


class Gradients(NamedTuple):
    """What :meth:`DeepFM.forward_backward` returns for one mini-batch."""

    loss_sum: float
    emb_grad: Any  # [rows, dim]
    dense_grad: Any  # [dense_size]; 0 at the running statistics
    running: RunningStats | None  # the new running statistics (batch_norm), else None


class DeepFM:
    """DeepFM: logit = FM second-order term + MLP + linear(dense features) + bias.

    Dense parameter layout, in this order in one flat float32 vector:

    1. for each MLP layer ``l`` (the hidden layers, then the output layer of
       width 1), with ``in_0 = num_fields * embedding_dim + num_dense`` and
       ``in_l`` the previous layer's width: ``W_l`` as ``[in_l, out_l]``
       row-major, then ``b_l`` as ``[out_l]``;
    2. ``w_lin`` ``[num_dense]``: the linear term on the dense features;
    3. ``bias`` ``[1]``;
    4. with ``batch_norm``, for each hidden layer ``l`` in order, four ``[out_l]`` vectors:
       ``gamma_l`` (initially 1), ``beta_l`` (0), ``running_mean_l`` (0) and
       ``running_var_l`` (1). Without it the vector ends at ``bias``, so a model without
       batch normalization keeps the layout it always had. A hidden layer's ``b_l`` stays in
       the layout but takes gradient 0 (the normalization subtracts it).

    A hidden layer is ``Linear -> BatchNorm -> activation -> dropout`` (FuxiCTR's
    MLP_Block order; torch.nn.BatchNorm1d's arithmetic: eps 1e-5, momentum 0.1, biased
    batch variance to normalize, unbiased to update ``running_var``). Training
    normalizes with the global batch's statistics; :meth:`predict` with the running ones.

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
        self._norm_offset = offset  # where the batch-norm vectors start
        if c.batch_norm:
            offset += 4 * sum(c.hidden)
        self._dense_size = offset
        running = [np.arange(start + 2 * width, start + 4 * width, dtype=np.int64)
                   for width, start in self._norm_layers()]  # fmt: skip
        self.running_index: npt.NDArray[np.int64] = (
            np.concatenate(running) if running else np.zeros(0, np.int64)
        )  # flat positions of every running_mean_l, running_var_l, in layout order

    def _norm_layers(self) -> list[tuple[int, int]]:
        """(width, offset) of each hidden layer's batch-norm vectors (none without it)."""
        if not self.config.batch_norm:
            return []
        layers, offset = [], self._norm_offset
        for width in self.config.hidden:
            layers.append((width, offset))
            offset += 4 * width
        return layers

    @property
    def max_reduction(self) -> int:
        """Floats in the largest ``batch_sum`` vector a training step reduces: the forward
        pass's ``[count, sum, sum of squares]`` of the widest hidden layer (0: none)."""
        widths = [width for width, _ in self._norm_layers()]
        return 1 + 2 * max(widths) if widths else 0

    @property
    def reductions_per_step(self) -> int:
        """``batch_sum`` calls of one training step: two per hidden layer with batch_norm."""
        return 2 * len(self.config.hidden) if self.config.batch_norm else 0

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
        for width, start in self._norm_layers():
            out[start : start + width] = 1.0  # gamma
            out[start + 3 * width : start + 4 * width] = 1.0  # running_var
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
        norms = [
            BatchNormParams(*(dense_params[start + k * width : start + (k + 1) * width]
                              for k in range(4)))
            for width, start in self._norm_layers()
        ]  # fmt: skip
        return DenseParams(layers, views[-2], views[-1], norms)

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
        training: bool = False,
        batch_sum: batch_norm.BatchSum | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Logits ``[B]`` and what the backward pass needs. With ``sample_ids`` (training
        with dropout), each hidden layer's output is masked by :func:`dropout_mask`. Batch
        normalization uses the global batch's statistics in ``training``, else the running
        ones."""
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
        inputs, pre, acts, masks, norms = [h], [], [], [], []
        for layer, (W, b) in enumerate(params.layers[:-1]):
            z = h @ W + b
            if params.norms:  # Linear -> BatchNorm -> activation -> dropout
                bn = params.norms[layer]
                if training:
                    norm = batch_norm.normalize_train(xp, z, bn.running_mean, bn.running_var,
                                                      batch_sum)  # fmt: skip
                    norms.append(norm)
                    xhat = norm.xhat
                else:
                    xhat = batch_norm.normalize_eval(xp, z, bn.running_mean, bn.running_var)
                z = bn.gamma * xhat + bn.beta
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
                 "acts": acts, "masks": masks, "norms": norms}  # fmt: skip
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
        batch_sum: batch_norm.BatchSum | None = None,
    ) -> Gradients:
        """``(loss_sum, emb_grad, dense_grad, running)`` of one mini-batch.

        ``loss_sum`` is the summed binary cross-entropy of the batch; the
        gradients are of ``loss_sum / loss_scale``. Callers pass the global
        batch size as ``loss_scale`` so that the gradients of the workers'
        mini-batches add up to the gradient of the global batch's mean loss.
        ``emb_grad[r]`` sums over every (sample, field) that uses row ``r``;
        missing fields (-1) contribute nothing. ``sample_ids`` (int64 ``[B]``, the
        samples' global indices: iteration x global batch + index in the global batch)
        draw the dropout masks; required when ``config.dropout > 0``, else unused.

        With ``batch_norm``, ``batch_sum`` sums a float32 vector over every worker of the
        global batch (None: this call holds the whole batch); it is called twice per
        hidden layer, in the same order on every worker (forward from the first layer,
        backward from the last), also by a worker with no samples. ``running`` is then
        the new running statistics, to write over the dense vector after its update.
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
        logit, cache = self._forward(params, emb, field_rows, dense_x, sample_ids, True,
                                     batch_sum)  # fmt: skip

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
        norms = cache["norms"]
        for layer in range(len(params.layers) - 1, -1, -1):
            W = params.layers[layer][0]
            dW, db = g.layers[layer]
            if layer < len(params.layers) - 1:
                if masks:  # through the dropout mask
                    dh = dh * masks[layer]
                dh = dh * self.activation.grad(xp, pre[layer], acts[layer])  # and activation
                if norms:  # and batch normalization (its running statistics: gradient 0)
                    norm, gamma, dnorm = norms[layer], params.norms[layer].gamma, g.norms[layer]
                    dnorm.gamma[...] = (dh * norm.xhat).sum(axis=0)
                    dnorm.beta[...] = dh.sum(axis=0)
                    dh = batch_norm.backward(xp, dh * gamma, norm, batch_sum)
            dW[...] = inputs[layer].T @ dh
            if not (norms and layer < len(norms)):
                db[...] = dh.sum(axis=0)
            # else: the normalization subtracts the bias, so its gradient is exactly 0; the
            # rounding noise of sum(dz) would be all an adaptive optimizer steps on.
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
        running = None
        if norms:  # one transfer: every layer's new running_mean, running_var
            values = xp.concatenate([v for n in norms for v in (n.running_mean, n.running_var)])
            running = RunningStats(self.running_index, to_host(values).astype(np.float32))
        return Gradients(loss_sum, emb_grad, grad, running)

    def predict(self, dense_params: Any, emb: Any, field_rows: Any, dense_x: Any) -> Any:
        """Click probabilities ``[B]`` (float32, on the array module's device); batch
        normalization uses the running statistics."""
        xp = self.xp
        dense_params, emb, field_rows, dense_x = self._inputs(
            dense_params, emb, field_rows, dense_x
        )
        logit, _ = self._forward(self.unpack(dense_params), emb, field_rows, dense_x)
        e = xp.exp(-xp.abs(logit))
        return xp.where(logit >= 0, f32(1) / (f32(1) + e), e / (f32(1) + e))
