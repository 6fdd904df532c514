"""FusedSwiGLUMLP: the whole gated MLP on packed weights, y = down(act(x·gate^T) · (x·up^T))."""

from __future__ import annotations

from typing import Callable, Mapping, NamedTuple

import torch
from torch import nn

from . import eager_graphs, formats, interleave as il
from .kernels import dispatch, fp8_layout, nvfp4_layout, ops, reference
from .kernels.pipeline import held_multiplier


class _Layout(NamedTuple):
    """A weight order the kernels read faster than the packed one: the dispatch rule (a function
    name, looked up when used) that says where a module holds it, and the reorders of the buffers
    that move (nvfp4: weight and scales; fp8: the weight, its scales keep their order)."""

    rule: str
    to_tile_major: Callable[..., tuple]
    to_packed: Callable[..., tuple]

    def reorder_in_place(self, tensors: list[torch.Tensor], tile_major: bool) -> None:
        """Rewrite contiguous ``tensors`` (the ones a reorder moves) into tile-major order or back to
        the packed one, keeping the tensors themselves (vLLM's parameters: its loader and graphs
        hold them); the new order passes through one temporary copy each."""
        if not all(t.is_contiguous() for t in tensors):
            raise ValueError("an in-place reorder needs contiguous tensors")
        for t, new in zip(tensors, (self.to_tile_major if tile_major else self.to_packed)(*tensors)):
            t.copy_(new)


_NVFP4_TILE_MAJOR = _Layout("nvfp4_tile_major", nvfp4_layout.to_tile_major, nvfp4_layout.to_packed)
_FP8_TILE_MAJOR = _Layout("fp8_tile_major", lambda w: (fp8_layout.to_tile_major(w),),
                          lambda w: (fp8_layout.from_tile_major(w),))


def tile_major_layout(fmt: formats.WeightFormat, kernel_ready: bool = True,
                      fp8_tile_major: bool = False) -> tuple[tuple[str, ...], _Layout] | None:
    """(the tensor names a reorder moves, their _Layout) of a projection in ``fmt`` whose weight the
    kernels may read tile-major, else None: nvfp4's weight and scales, and an fp8 weight where the
    projection asks for it (``fp8_tile_major``: gate_up, whose every backend reads that order;
    down's cuBLAS and DeepGEMM do not); ``kernel_ready`` False opts a projection out (a gate_up
    with another interleave than the kernels'). Shared by FusedSwiGLUMLP and the vLLM plugin's MLP."""
    if kernel_ready and fmt.tile_major_order:
        return (fmt.weight_name, fmt.scale_name), _NVFP4_TILE_MAJOR
    if kernel_ready and fp8_tile_major and fmt.name == formats.FP8Block128.name:
        return (fmt.weight_name,), _FP8_TILE_MAJOR
    return None


class _PackedProjection(nn.Module):
    """Holds one projection's packed tensors as buffers named by their format suffix, so the
    module's state_dict keys are the checkpoint's (``gate_up_interleaved.weight_scale_inv``, ...).

    An nvfp4 weight and its scales are kept in nvfp4_layout's tile-major order wherever the sm90
    kernels read them (dispatch.nvfp4_tile_major; ``kernel_ready`` False opts a projection out,
    as a gate_up with another interleave than the kernels'), and so is an fp8 weight (fp8_layout;
    its scales keep their order) of a projection made with ``fp8_tile_major`` where
    dispatch.fp8_tile_major says so (gate_up: every backend that runs it reads that order; down's
    cuBLAS and DeepGEMM do not); ``tile_major`` says which order the buffers hold. The order is settled whenever the tensors move (``_apply``: .to(), .cuda(),
    .cpu()) or load (``load_state_dict``; loaders that assign buffers directly call
    ``settle_layout`` after), and state_dict always gives the packed format's order. A reorder
    replaces the two buffers with new tensors: a tensor the caller passed in is never changed.
    """

    def __init__(self, tensors: Mapping[str, torch.Tensor], weight_format: str | None = None,
                 kernel_ready: bool = True, global_scale_kind: str | None = None, fp8_tile_major: bool = False):
        super().__init__()
        for suffix, t in tensors.items():
            self.register_buffer(suffix, t)
        fmt = formats.weight_format(weight_format) if weight_format else None
        # the per-tensor scale's buffer name and kind, and its fp32 multiplier (_settle_multiplier)
        self._global_scale = (fmt.global_scale_name, global_scale_kind) if fmt and fmt.global_scale_name else None
        self._multiplier: torch.Tensor | None = None
        self._multiplier_of: torch.Tensor | None = None  # the buffer it was made from
        # (the buffer names a reorder moves, their _Layout) of a weight that has a tile-major order
        self._reorderable = tile_major_layout(fmt, kernel_ready, fp8_tile_major) if fmt else None
        self.tile_major = False
        self.settle_layout()

    def kernel_tensors(self) -> dict[str, torch.Tensor]:
        """The tensors as held: what the ops read, an nvfp4 weight in the order ``tile_major`` says."""
        return dict(self.named_buffers())

    def op_tensors(self) -> dict[str, torch.Tensor]:
        """kernel_tensors with the per-tensor scale (if any) as its fp32 multiplier: pass them to
        the ops with global_scale_kind formats.MULTIPLIER."""
        out = self.kernel_tensors()
        if self._global_scale is not None:
            name = self._global_scale[0]
            gs = out[name]
            if not torch.compiler.is_compiling() and self._multiplier_of is not gs:
                self._settle_multiplier()  # (a buffer assigned without settle_layout)
            out[name] = self._multiplier
        return out

    def tensors(self) -> dict[str, torch.Tensor]:
        """The packed format's tensors (a tile-major nvfp4 weight and scales: copies in the packed order)."""
        out = self.kernel_tensors()
        if self.tile_major:
            out.update(self._packed_copies())
        return out

    def _packed_copies(self) -> dict[str, torch.Tensor]:
        """The tile-major weight (and nvfp4's scales) as new tensors in the packed order."""
        names, layout = self._reorderable
        return dict(zip(names, layout.to_packed(*(self._buffers[n] for n in names))))

    def settle_layout(self) -> None:
        """Put a reorderable weight in the order its device's kernels read (tile-major where
        dispatch.nvfp4_tile_major / fp8_tile_major says so, else the packed order), and make its
        per-tensor scale's multiplier (op_tensors)."""
        if self._reorderable is not None:
            names, layout = self._reorderable
            self._set_tile_major(getattr(dispatch, layout.rule)(self._buffers[names[0]]))
        if self._global_scale is not None:
            self._settle_multiplier()

    def _settle_multiplier(self) -> None:
        """The per-tensor scale as the ops take it (pipeline.held_multiplier)."""
        gs = self._buffers[self._global_scale[0]]
        self._multiplier = held_multiplier(self._multiplier, self._multiplier_of, gs, self._global_scale[1])
        self._multiplier_of = gs

    def _set_tile_major(self, want: bool) -> None:
        if want == self.tile_major:
            return
        names, layout = self._reorderable
        reorder = layout.to_tile_major if want else layout.to_packed
        for name, t in zip(names, reorder(*(self._buffers[n] for n in names))):
            self._buffers[name] = t
        self.tile_major = want

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.tile_major:  # the packed format's order, in new tensors on the buffers' device
            for name, t in self._packed_copies().items():
                destination[prefix + name] = t

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        self._set_tile_major(False)  # the incoming tensors are in the packed order
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self.settle_layout()

    def _apply(self, fn, recurse=True):
        # model.to(torch.bfloat16), .half(), .float() cast every floating tensor, e4m3 weights and
        # fp32 scales included (lossy, or out of range: an nvfp4 global scale overflows fp16). The
        # format fixes these dtypes, so a cast only moves them (to its device); device moves,
        # to_empty and share_memory apply as they are.
        for name, t in self._buffers.items():
            if t is not None:
                out = fn(t)
                self._buffers[name] = out if out.dtype == t.dtype else t.to(out.device)
        self.settle_layout()
        return self


class FusedSwiGLUMLP(nn.Module):
    """The gated MLP on packed weights: forward = quant_x → gate_up → down (kernels.ops).

    ``eager_graph_rows``: plain eager calls on the sm90 backend with at most this many rows (all
    leading dimensions together) run as a cached CUDA graph (``eager_graphs.py``: eager decode is
    host-bound otherwise); 0 turns that off. Under torch.compile or inside another graph capture
    the ops run as usual.
    """

    def __init__(self, gate_up: Mapping[str, torch.Tensor], down: Mapping[str, torch.Tensor], *,
                 weight_format: str, interleave: int = formats.DEFAULT_INTERLEAVE, activation: str = "silu",
                 global_scale_kind: str | None = None):
        super().__init__()
        fmt = formats.weight_format(weight_format)
        reference.activation(activation)  # fail early on an unknown name
        problems = formats.module_problems(
            {**{f"m.{formats.GATE_UP}.{k}": v for k, v in gate_up.items()},
             **{f"m.{formats.DOWN}.{k}": v for k, v in down.items()}},
            "m", formats.PackedConfig(weight_format, interleave, activation, ("m",), global_scale_kind))
        if problems:
            raise formats.FormatError("FusedSwiGLUMLP: " + "; ".join(str(p).replace("m.", "", 1) for p in problems))
        self.weight_format, self.interleave, self.activation = fmt.name, interleave, activation
        self.global_scale_kind = global_scale_kind if fmt.global_scale_name else None
        # = formats.GATE_UP: state_dict keys are the checkpoint's; an nvfp4 or fp8 gate_up is
        # tile-major only with the kernels' interleave
        self.gate_up_interleaved = _PackedProjection(gate_up, fmt.name,
                                                     kernel_ready=dispatch.format_has_kernels(fmt.name, interleave),
                                                     global_scale_kind=self.global_scale_kind, fp8_tile_major=True)
        self.down_proj = _PackedProjection(down, fmt.name, global_scale_kind=self.global_scale_kind)
        w = gate_up[fmt.weight_name]
        self.hidden_size, self.intermediate_size = fmt.cols_of(w), w.shape[0] // 2  # (load_state_dict keeps shapes)
        self.eager_graph_rows = eager_graphs.MAX_ROWS if dispatch.format_has_kernels(fmt.name, interleave) else 0

    @classmethod
    def from_linear(cls, gate: nn.Linear | torch.Tensor, up: nn.Linear | torch.Tensor, down: nn.Linear | torch.Tensor,
                    *, weight_format: str = "fp8_block128", interleave: int = formats.DEFAULT_INTERLEAVE,
                    activation: str = "silu") -> "FusedSwiGLUMLP":
        """Quantize and pack plain gate / up / down projections (modules or weights; no biases)."""
        biased = [n for n, m in zip(("gate", "up", "down"), (gate, up, down)) if getattr(m, "bias", None) is not None]
        if biased:
            raise formats.FormatError(f"{', '.join(biased)}: projections with a bias are not supported "
                                      "(the packed format has no bias)")
        # detached: packed buffers must not carry an autograd graph (it would keep the bf16
        # weights alive and send every call through the dispatcher, see ops.runs_directly)
        w = [(m.weight if isinstance(m, nn.Module) else m).detach() for m in (gate, up, down)]
        fmt = formats.weight_format(weight_format)
        kind = formats.DIVISOR if fmt.global_scale_name else None
        g, u, d = (fmt.quantize(t.float(), name, kind) for t, name in zip(w, ("gate", "up", "down")))
        formats.check_interleave(w[0].shape[0], interleave, fmt, "FusedSwiGLUMLP")
        return cls(il.pack_gate_up(g, u, interleave, fmt), d, weight_format=weight_format,
                   interleave=interleave, activation=activation, global_scale_kind=kind)

    @classmethod
    def empty(cls, hidden: int, intermediate: int, *, weight_format: str, interleave: int = formats.DEFAULT_INTERLEAVE,
              activation: str = "silu", global_scale_kind: str | None = None,
              device: torch.device | str = "meta") -> "FusedSwiGLUMLP":
        """A module with the right tensors, shapes and dtypes but no values (a loader fills them)."""
        fmt = formats.weight_format(weight_format)
        formats.check_interleave(intermediate, interleave, fmt, "FusedSwiGLUMLP")
        if fmt.global_scale_name and global_scale_kind is None:
            global_scale_kind = formats.DIVISOR

        def make(rows, cols, halves):
            return {k: torch.empty(shape, dtype=dtype, device=device)
                    for k, (dtype, shape) in fmt.tensors(rows, cols, halves).items()}
        return cls(make(2 * intermediate, hidden, 2), make(hidden, intermediate, 1), weight_format=weight_format,
                   interleave=interleave, activation=activation, global_scale_kind=global_scale_kind)

    @classmethod
    def from_packed(cls, checkpoint, module: str) -> "FusedSwiGLUMLP":
        """One MLP of a packed checkpoint: ``checkpoint`` has the checkpoint's ``config``
        (formats.PackedConfig) and ``module(name)`` → (gate_up tensors, down tensors), as
        ``weight_packing.packed_checkpoint.PackedCheckpoint`` has (the runtime does not import the packer)."""
        cfg = checkpoint.config
        gate_up, down = checkpoint.module(module)
        return cls(gate_up, down, weight_format=cfg.weight_format, interleave=cfg.interleave,
                   activation=cfg.activation, global_scale_kind=cfg.global_scale_kind)

    @property
    def backend(self) -> str:
        """Where forward runs: "sm90" (the CuTe DSL kernels; down partly on cuBLAS) or "reference"
        (dispatch.module_backend)."""
        w = self.gate_up_interleaved.kernel_tensors()[formats.weight_format(self.weight_format).weight_name]
        return dispatch.module_backend(self.weight_format, self.interleave, w.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        if x.numel() == 0:
            return x.new_empty(x.shape)
        y = None
        if self.eager_graph_rows and not torch.compiler.is_compiling() and dispatch.sm90_kernels_usable(x.device):
            buffers = (*self.gate_up_interleaved._buffers.values(), *self.down_proj._buffers.values())
            y = eager_graphs.run(self, x.reshape(-1, x.shape[-1]), self._ops_forward, buffers)
        if y is None:
            return self._ops_forward(x)
        return y.reshape(*x.shape[:-1], y.shape[-1])

    def _check_input(self, x) -> None:
        if not isinstance(x, torch.Tensor) or x.dim() == 0:
            raise TypeError(f"x: expected a tensor [..., hidden], got {type(x).__name__ if not isinstance(x, torch.Tensor) else 'a 0-d tensor'}")
        if not x.is_floating_point():
            raise TypeError(f"x: FusedSwiGLUMLP takes floating-point activations (bf16, fp16 or fp32), got {x.dtype}; "
                            "token ids go through the model's embedding first")
        if x.dtype not in ops.OUT_DTYPES:  # y has x's dtype: the dtypes down can write
            raise TypeError(f"x: FusedSwiGLUMLP takes bf16, fp16 or fp32 activations "
                            f"({', '.join(map(str, ops.OUT_DTYPES))}), got {x.dtype}; cast x first, e.g. x.float()")
        if x.shape[-1] != self.hidden_size:
            raise ValueError(f"x: last dimension is {x.shape[-1]}, but this MLP's hidden size is {self.hidden_size}")

    def _ops_forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.mlp(x, self.gate_up_interleaved.op_tensors(), self.down_proj.op_tensors(),
                       weight_format=self.weight_format, interleave=self.interleave, act=self.activation,
                       global_scale_kind=formats.MULTIPLIER if self.global_scale_kind else None,
                       tile_major=(self.gate_up_interleaved.tile_major, self.down_proj.tile_major))

    def extra_repr(self) -> str:
        graphs = ""
        if self.eager_graph_rows and self.backend == "sm90":
            graphs = f", eager_graph_rows={self.eager_graph_rows}"
        return (f"hidden={self.hidden_size}, intermediate={self.intermediate_size}, format={self.weight_format}, "
                f"g={self.interleave}, activation={self.activation}, backend={self.backend}{graphs}")
