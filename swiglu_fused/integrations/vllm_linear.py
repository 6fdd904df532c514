"""vLLM linear methods of the ``swiglu_fused`` quantization (imported by vLLM's model code only).

* ``PackedLinearMethod``: a linear listed in ``quantization_config.linears`` (attention q/k/v/o of a
  checkpoint converted from an FP8 or NVFP4 source) runs our own linear op, as
  ``swiglu_fused.linear.PackedLinear`` does under transformers: quant_x then the down GEMM for
  fp8, the down GEMM on bf16 x for nvfp4. vLLM fuses q/k/v into one layer; each of its shards keeps
  its own tensors (an fp8 block grid per shard: k and v may be 64 rows, less than one 128-row block),
  so one x quantization feeds one GEMM per shard. A checkpoint that stores the fused layer as one
  matrix (Phi-3's qkv_proj) is that layer's one shard at T = 1, as under transformers; at T > 1 it
  is split into vLLM's logical shards as it loads (each rank's rows lie in q, k and v).
* ``ReplacedMLPProjection``: what vLLM's own gate_up_proj / down_proj of a packed MLP get. They
  create no weights: the model subclass (vllm_models.py) replaces the whole MLP right after vLLM
  builds it.
"""

from __future__ import annotations

import torch
from torch.nn import Parameter
from vllm.model_executor.layers.linear import LinearMethodBase, QKVParallelLinear, RowParallelLinear

from .. import formats
from ..formats import FormatError
from ..kernels import dispatch, nvfp4_layout, ops
from ..kernels.pipeline import held_multiplier
from .vllm_layout import granule, shard_range

_QKV = {"q": 0, "k": 1, "v": 2}


class ReplacedMLPProjection(LinearMethodBase):
    def __init__(self, prefix: str):
        self.prefix = prefix

    def create_weights(self, layer, *args, **kwargs) -> None:
        pass  # the MLP holding this layer is replaced by vllm_models.FusedMLP before loading

    def apply(self, layer, x, bias=None):
        raise RuntimeError(f"{self.prefix}: this projection of a packed MLP was not replaced by swiglu_fused's "
                           "FusedMLP; the model class is not the one swiglu_fused registers (is the vLLM plugin "
                           "loaded? VLLM_PLUGINS must include swiglu_fused)")


def load_slice(fmt: formats.WeightFormat, suffix: str, loaded: torch.Tensor, axis: int, start: int, length: int,
               full: int, what: str) -> torch.Tensor:
    """The part of a stored tensor that holds matrix rows (axis 0) / columns (axis 1)
    [start, start + length) of ``full``; FormatError when the range splits a block."""
    if start == 0 and length == full:
        return loaded
    r = shard_range(fmt, suffix, axis, start, length, full)
    if r is None:
        side = "rows" if axis == 0 else "columns"
        raise FormatError(f"{what}.{suffix}: tensor parallelism gives this rank {side} [{start}, {start + length}) "
                          f"of {full}, which splits a block of {fmt.name} (blocks of "
                          f"{granule(fmt, suffix, axis)} {side}); use a smaller "
                          "tensor_parallel_size")
    return loaded.narrow(axis, r[0], r[1])


def _stored_rows(layer) -> list[int]:
    """Rows of each of a fused layer's logical shards in the checkpoint (before any split)."""
    if isinstance(layer, QKVParallelLinear):
        kv = layer.total_num_kv_heads
        return [layer.total_num_heads * layer.head_size, kv * layer.head_size, kv * layer.v_head_size]
    return list(layer.output_sizes)


class PackedLinearMethod(LinearMethodBase):
    """A vLLM linear layer on packed tensors (one or several logical shards, tensor-parallel)."""

    def __init__(self, packed: formats.PackedConfig, prefix: str, shard_names: list[str] | None):
        self.packed, self.prefix, self.shard_names = packed, prefix, shard_names
        self.fmt = formats.weight_format(packed.weight_format)

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
                       params_dtype, **extra):
        fmt, k = self.fmt, input_size_per_partition
        sizes = list(output_partition_sizes)
        stored_fused = self.shard_names is None and len(sizes) > 1
        layer.swiglu_split_on_load = stored_fused and getattr(layer, "tp_size", 1) > 1
        layer.swiglu_rows = [sum(sizes)] if stored_fused and not layer.swiglu_split_on_load else sizes
        for suffix, (dtype, shape) in fmt.tensors(1, k, 1).items():
            if len(shape) == 2:
                rows = sum(fmt.tensors(n, k, 1)[suffix][1][0] for n in layer.swiglu_rows)
                shape = (rows, shape[1])
            else:  # a per-tensor scale: one per shard
                shape = (len(layer.swiglu_rows),)
            p = Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)
            p.weight_loader = self._loader(layer, suffix)
            layer.register_parameter(suffix, p)

    def _loader(self, layer, suffix: str):
        def weight_loader(param, loaded: torch.Tensor, shard_id=None):
            self._load(layer, suffix, param, loaded, shard_id)
        return weight_loader

    def _shard_index(self, layer, shard_id) -> int:
        if shard_id is None:
            return 0
        return _QKV[shard_id] if isinstance(layer, QKVParallelLinear) else int(shard_id)

    def _rows_of(self, layer, s: int, shard_id) -> tuple[int, int, int]:
        """(start, length, full) of this rank's rows of logical shard ``s``."""
        n = layer.swiglu_rows[s]
        tp, rank = getattr(layer, "tp_size", 1), getattr(layer, "tp_rank", 0)
        if isinstance(layer, RowParallelLinear) or tp == 1:
            return 0, n, n
        if isinstance(layer, QKVParallelLinear):
            full = _stored_rows(layer)[s]
            r = rank if shard_id == "q" else rank // layer.num_kv_head_replicas
            return (0 if full == n else r * n), n, full  # k/v replicated when T > kv heads
        return rank * n, n, n * tp

    def _load(self, layer, suffix, param, loaded, shard_id) -> None:
        self._restore_packed(layer)  # (a reload: the checkpoint's bytes are in the packed order)
        if shard_id is None and layer.swiglu_split_on_load:
            self._load_split(layer, suffix, param, loaded)
            return
        fmt, s = self.fmt, self._shard_index(layer, shard_id)
        what = f"{self.prefix}[{shard_id}]" if shard_id is not None else self.prefix
        if param.dim() == 1:  # per-tensor scale: replicated, one per shard
            param.data[s:s + 1].copy_(loaded.reshape(1))
            return
        start, n, full = self._rows_of(layer, s, shard_id)
        part = load_slice(fmt, suffix, loaded, 0, start, n, full, what)
        if isinstance(layer, RowParallelLinear) and layer.tp_size > 1:
            k = layer.input_size_per_partition
            part = load_slice(fmt, suffix, part, 1, layer.tp_rank * k, k, layer.input_size, what)
        row0 = sum(fmt.tensors(m, 1, 1)[suffix][1][0] for m in layer.swiglu_rows[:s])
        dst = param.data.narrow(0, row0, part.shape[0])
        if tuple(dst.shape) != tuple(part.shape) or param.dtype != loaded.dtype:
            raise FormatError(f"{what}.{suffix}: the checkpoint holds {loaded.dtype} {list(loaded.shape)}, this rank "
                              f"needs {param.dtype} {list(dst.shape)} of it; config.json and the packed tensors "
                              "are not from the same model")
        dst.copy_(part)

    def _load_split(self, layer, suffix, param, loaded) -> None:
        """One stored matrix of a fused layer (Phi-3's qkv_proj) at T > 1: load it as vLLM's
        logical shards (the rows of q, k, v; of each merged part), a per-tensor scale into each."""
        ids = list(_QKV) if isinstance(layer, QKVParallelLinear) else list(range(len(layer.swiglu_rows)))
        full, start = _stored_rows(layer), 0
        for shard_id, rows in zip(ids, full):
            part = loaded if param.dim() == 1 else load_slice(self.fmt, suffix, loaded, 0, start, rows, sum(full),
                                                              f"{self.prefix}[{shard_id}]")
            self._load(layer, suffix, param, part, shard_id)
            start += rows

    def _shards(self, layer):
        """Per logical shard: (weight, scale, global scale) views, in the packed order (apply makes
        them every call: _slices keeps only their rows, so that the views cost ~a µs each)."""
        fmt, out = self.fmt, []
        names = (fmt.weight_name, fmt.scale_name, fmt.global_scale_name)
        for slices in self._slices(layer):
            views = []
            for name in names:
                if name is None:
                    views.append(None)
                    continue
                p, (r0, m) = getattr(layer, name), slices[name]
                views.append(p.narrow(0, r0, m))
            out.append(tuple(views))
        return out

    def _slices(self, layer) -> list:
        """Per logical shard: {tensor suffix: (first row, rows)} of the layer's parameters (a per-tensor
        scale: one value a shard); fixed by swiglu_rows, so made once."""
        slices = getattr(layer, "swiglu_slices", None)
        if slices is None:
            rows, slices = {}, []
            for s, n in enumerate(layer.swiglu_rows):
                shard = {}
                for suffix, (_, shape) in self.fmt.tensors(n, 1, 1).items():
                    if len(shape) == 1:  # (one value a shard)
                        shard[suffix] = (s, 1)
                        continue
                    shard[suffix] = (rows.get(suffix, 0), shape[0])
                    rows[suffix] = shard[suffix][0] + shape[0]
                slices.append(shard)
            layer.swiglu_slices = slices
        return slices

    def process_weights_after_loading(self, layer) -> None:
        # each nvfp4 shard in the order its device's kernels read (tile-major on an sm90 GPU where
        # its tiles are whole: DESIGN §3.3), in place: vLLM keeps the parameters. Each global scale's
        # multiplier is made here, not a launch a call (pipeline.held_multiplier), and on a reload
        # written into the one made before, so that CUDA graphs captured before it read the new value.
        # Nothing else is kept: apply takes its views of the parameters each call, since vLLM's
        # in-place reload runs this on fresh parameters and then copies them into the layer's own
        # (views kept from here would keep the fresh ones alive: a second copy of the weights)
        majors, mults = [], []
        held = getattr(layer, "swiglu_multipliers", None)
        for i, (w, scale, gs) in enumerate(self._shards(layer)):
            majors.append(dispatch.nvfp4_tile_major(w) and w.is_contiguous())
            if majors[-1]:
                nvfp4_layout.reorder_in_place(w, scale, True)
            mult = None
            if gs is not None:
                mult = held_multiplier(held[i] if held else None, None, gs, self.packed.global_scale_kind)
                mult = None if mult is gs else mult  # (a stored fp32 multiplier: the parameter itself)
            mults.append(mult)
        layer.swiglu_majors, layer.swiglu_multipliers = tuple(majors), mults

    def _restore_packed(self, layer) -> None:
        """The packed order back in every tile-major shard (before a reload writes into them; vLLM's
        in-place reload loads into fresh parameters, on the meta device first: nothing to do there)."""
        if getattr(layer, self.fmt.weight_name).is_meta or not any(getattr(layer, "swiglu_majors", ())):
            return
        for (w, scale, _), major in zip(self._shards(layer), layer.swiglu_majors):
            if major:
                nvfp4_layout.reorder_in_place(w, scale, False)
        layer.swiglu_majors = (False,) * len(layer.swiglu_majors)

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        x_scale = None
        if self.fmt.quantizes_x:
            x2, x_scale = ops.quant_x(x2)
        ys = [ops.down(x2, w, scale, x_scale, gs if mult is None else mult, out_dtype=x.dtype, tile_major=major)
              for (w, scale, gs), mult, major in zip(self._shards(layer), layer.swiglu_multipliers,
                                                     layer.swiglu_majors)]
        y = ys[0] if len(ys) == 1 else torch.cat(ys, dim=-1)
        if bias is not None:
            y = y + bias.to(y.dtype)
        return y.reshape(*lead, y.shape[-1])
