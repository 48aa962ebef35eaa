"""A linear layer for 1-16 rows that reads each weight once: the verify forward's kernel on CPUs.

A decoding step multiplies one row (the last token) by every weight matrix, and a verify forward
multiplies k + 1 rows. Both are bound by memory: the weights are read from RAM once per forward.
On this project's CPU (AMD EPYC, AVX2) PyTorch's float32 `F.linear` goes to MKL, whose GEMM packs
(copies) weight panels before it multiplies, so a product with 2-8 rows costs 2-3 times one row
(SmolLM2's lm_head, 49,152 x 576, one thread: 11 ms for one row, 27 ms for two, 44 ms for
three). Speculation cannot pay when verifying three positions costs three decoding steps.
few_rows.c streams each weight row once and multiplies it by every input row while it is in
registers: a SmolLM2 forward over 5 positions then costs about 1.1 times one position, not 2.2
(docs/scale.md, "The few-row kernel"; scripts/measure_verify_forward.py --kernel both).

The C file is compiled once per machine with the system's C compiler (`cc`, or $CC) into
<cache>/kernels/ (the cache folder of core.loading.gguf), keyed by the source, the flags and the
CPU, and loaded with ctypes; OpenMP threads come from torch's own libgomp, which is already
loaded (same soname), and their count is torch.get_num_threads() at each call. Where there is no
compiler, the build fails or SPECSCOPE_ROW_KERNEL=0 is set, nothing changes: `install` returns 0
and every layer keeps PyTorch's `F.linear`. The reason is in `kernel_status()`.

`install(model)` switches the model's plain `nn.Linear` layers to `FewRowsLinear` (same
parameters, same state dict): float32 CPU inputs of 1-16 rows, outside autograd, go to the kernel;
everything else (prefill, training, other dtypes, CUDA) to `F.linear`. A checkpoint stored in
bfloat16 and upcast on load holds float32 weights that are all exact bfloat16 values: a layer then
keeps their upper halves (2 bytes a weight) beside them and the kernel reads those, converting each
back to the same float32 in registers. The products and sums are the same, in the same order, so
the output is the same to the bit, from half the memory traffic (one row through a 49,152 x 576
bfloat16-exact weight, 2 threads: 4.2 ms against 6.4; weights that fit in cache gain little).
Each output element is summed in one fixed order whatever the row count or thread count, so a position's logits are the
same whether it is verified alone or with seven others (`tests/core/kernels/test_few_rows.py`).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)

MAX_ROWS = 16  # few_rows.c's FEW_ROWS_MAX: more rows go to F.linear (a GEMM pays there)
# Smaller weights stay on F.linear: they sit in cache, where the ~15 µs the Python side of a
# kernel call adds to F.linear's costs more than the kernel saves (a 64 x 32 layer: 21 µs against 12)
MIN_WEIGHT = 1 << 16
ENV_SWITCH = "SPECSCOPE_ROW_KERNEL"
SOURCE = Path(__file__).with_name("few_rows.c")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")

_lock = threading.Lock()
_state: dict[str, object] = {}


def kernel_status() -> str:
    """'on', or why the kernel is off (no compiler, the build's error, the switch)."""
    _library()
    return str(_state["status"])


def kernel_available() -> bool:
    return _library() is not None


def few_rows_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, halves: torch.Tensor | None = None
) -> torch.Tensor:
    """x @ weight.T + bias for float32 CPU tensors with 1..MAX_ROWS rows (leading dims flattened).

    `halves`: the weight's bfloat16 bits (`bfloat16_halves(weight)`) where every weight is exactly
    a bfloat16 value; the kernel then reads them, half the bytes, and gives the same bits.
    Falls back to F.linear for anything the kernel does not take, so it is always correct.
    Every check is cheap on purpose: a decoding step calls this a few hundred times."""
    call = _state.get("call") if "call" in _state else _entry()
    n_in = x.shape[-1]
    rows = x.numel() // n_in if n_in else 0
    if call is None or not _takes(x, weight, bias, rows):
        return F.linear(x, weight, bias)
    n_out = weight.shape[0]
    flat = x.reshape(rows, n_in).contiguous()
    out = torch.empty((rows, n_out), dtype=torch.float32)
    if halves is not None:
        call = _state["call16"]
    call(  # type: ignore[operator]
        flat.data_ptr(),
        (weight if halves is None else halves).data_ptr(),
        bias.data_ptr() if bias is not None else None,
        out.data_ptr(),
        rows,
        n_in,
        n_out,
        torch.get_num_threads(),
    )
    return out.view(*x.shape[:-1], n_out)


def bfloat16_halves(weight: torch.Tensor) -> torch.Tensor | None:
    """The upper 16 bits of each float32 weight (an int16 tensor, contiguous, on the CPU) when
    every weight is exactly a bfloat16 value (a checkpoint stored in bfloat16 and upcast on
    load), else None: the float32 weights' products and sums, from half the memory."""
    if weight.dtype is not _F32 or not weight.is_cpu or not weight.is_contiguous():
        return None
    with torch.no_grad():
        first = weight.detach()[:1]  # most float32 checkpoints fail on their first row: no full copy at load
        if not torch.equal(first.bfloat16().float(), first):
            return None
        halves = weight.detach().bfloat16()
        if not torch.equal(halves.float(), weight.detach()):
            return None
        return halves.view(torch.int16).contiguous()


_F32 = torch.float32


def _takes(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, rows: int) -> bool:
    if not 0 < rows <= MAX_ROWS or x.dtype is not _F32 or weight.dtype is not _F32 or not (x.is_cpu and weight.is_cpu):
        return False
    if not weight.is_contiguous():
        return False
    if bias is not None and (bias.dtype is not _F32 or not bias.is_cpu or not bias.is_contiguous()):
        return False
    # the kernel has no backward: training stays on F.linear
    return not torch.is_grad_enabled() or not (
        x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    )


class FewRowsLinear(nn.Linear):
    """nn.Linear whose forward sends 1..MAX_ROWS float32 CPU rows to few_rows.c, reading the
    weights' bfloat16 halves where they are exact. They are kept beside the weights (not in the
    state dict) and made again when the weights change: a new tensor, or an in-place update that
    bumps the tensor's version (an optimizer step, load_state_dict, a copy_ under no_grad; not a
    write through `.data`, which torch does not count)."""

    _halves: torch.Tensor | None = None
    _halves_of: tuple[int, int] | None = None  # the (data pointer, version) of the weight they were made from

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # nn.Linear's own parameter name
        weight = self.weight
        if self._halves_of != (weight.data_ptr(), weight._version):
            self.keep_halves()
        return few_rows_linear(input, weight, self.bias, self._halves)

    def keep_halves(self) -> None:
        weight = self.weight
        self._halves = bfloat16_halves(weight) if _state.get("call16") is not None else None
        self._halves_of = (weight.data_ptr(), weight._version)


def install(model: nn.Module) -> int:
    """Switch the model's plain nn.Linear layers of at least MIN_WEIGHT weights to
    FewRowsLinear; the count switched.

    0 when the kernel is off (kernel_status() says why). Subclasses of nn.Linear (quantized or
    a library's own layers) are left alone: their forward is theirs."""
    if _library() is None:
        return 0
    switched = 0
    for module in model.modules():
        if type(module) is nn.Linear and module.weight.numel() >= MIN_WEIGHT:
            module.__class__ = FewRowsLinear
            cast(FewRowsLinear, module).keep_halves()
            switched += 1
    return switched


def remove(model: nn.Module) -> int:
    """Undo install: FewRowsLinear layers back to nn.Linear; the count switched back."""
    switched: list[nn.Module] = [m for m in model.modules() if type(m) is FewRowsLinear]
    for module in switched:
        module.__class__ = nn.Linear
        for name in ("_halves", "_halves_of"):
            module.__dict__.pop(name, None)
    return len(switched)


def installed(model: nn.Module) -> bool:
    return any(type(m) is FewRowsLinear for m in model.modules())


def _library() -> ctypes.CDLL | None:
    with _lock:
        if "lib" not in _state:
            lib, status = _load()
            _state["lib"], _state["status"] = lib, status
            # the hot path reads this one entry without the lock
            _state["call"] = lib.few_rows_linear if lib is not None else None
            _state["call16"] = lib.few_rows_linear_bf16 if lib is not None else None
            if lib is None:
                log.info("few-row kernel off: %s", status)
        return _state["lib"]  # type: ignore[return-value]


def _entry() -> object:
    _library()
    return _state["call"]


def _load() -> tuple[ctypes.CDLL | None, str]:
    if os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "off", "no", "false"):
        return None, f"off ({ENV_SWITCH}=0)"
    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "AMD64"):
        return None, f"off (built and measured on x86-64 Linux only; this is {sys.platform} {platform.machine()})"
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        return None, "off (no C compiler: install gcc, or set CC)"
    try:
        path = _built(compiler)
        lib = ctypes.CDLL(str(path))
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"off (the build failed: {str(exc).strip().splitlines()[-1] if str(exc).strip() else exc!r})"
    lib.few_rows_linear.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long] * 3 + [ctypes.c_int]
    lib.few_rows_linear.restype = ctypes.c_int
    lib.few_rows_linear_bf16.argtypes = lib.few_rows_linear.argtypes
    lib.few_rows_linear_bf16.restype = ctypes.c_int
    if lib.few_rows_max() != MAX_ROWS:
        return None, f"off (few_rows.c takes {lib.few_rows_max()} rows, few_rows.py {MAX_ROWS})"
    return lib, "on"


def _cpu_key() -> str:
    """The CPU's identity for the cache key: -march=native code must not run on another CPU."""
    try:
        info = Path("/proc/cpuinfo").read_text(errors="replace")
        lines = [line for line in info.splitlines() if line.startswith(("model name", "flags"))]
        return "\n".join(dict.fromkeys(lines))
    except OSError:
        return platform.processor()


def _built(compiler: str) -> Path:
    from specscope.core.loading.errors import CheckpointError
    from specscope.core.loading.gguf import cache_root

    source = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, " ".join(FLAGS).encode(), compiler.encode(), _cpu_key().encode()]))
    try:
        folder = cache_root() / "kernels"
        folder.mkdir(parents=True, exist_ok=True)
    except (CheckpointError, OSError):
        folder = Path(tempfile.gettempdir()) / f"specscope-kernels-{os.getuid() if hasattr(os, 'getuid') else 0}"
        folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"few_rows-{key.hexdigest()[:16]}.so"
    if path.is_file():
        return path
    # another process may build the same file at the same time: each writes its own, one rename wins
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
    os.close(fd)
    try:
        subprocess.run(
            [compiler, *FLAGS, str(SOURCE), "-o", tmp], check=True, capture_output=True, text=True, timeout=120
        )
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
    except subprocess.CalledProcessError as exc:
        raise subprocess.SubprocessError((exc.stderr or exc.stdout or str(exc)).strip()) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    log.info("few-row kernel built: %s", path)
    return path
