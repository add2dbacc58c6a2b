"""Which backend runs a problem, and why: every backend's verdict (the JSON of `kvattn
explain`), the backend auto would pick, and this machine's devices."""

from __future__ import annotations

from typing import Any, Dict, List

from . import _kvattn
from ._attention import problem_fields
from ._tensors import dtype_name

_DTYPE_KEYS = ("q_data_type", "kv_data_type", "o_data_type")


def _problem(op: str, problem: Dict[str, Any]) -> Any:
    values = dict(problem)
    for key in _DTYPE_KEYS:
        if values.get(key) is not None:
            values[key] = dtype_name(values[key], key)
    if values.get("sm_scale") is not None:
        values["sm_scale"] = float(values["sm_scale"])
    return _kvattn.Problem(**problem_fields(op=op, **values))


def explain(op: str, *, device: str = "cpu", **problem: Any) -> Dict[str, Any]:
    """Every backend's verdict on a problem: {"device", "selected", "verdicts": [{"backend",
    "supported", "reason", "available", "availability"}]}; the cpu verdict also names the CPU
    kernel its plan would run ("cpu_kernel", from the cpu backend's kernel table; null with
    "cpu_kernel_error" where KVATTN_CPU_KERNEL names one that does not apply), and
    "cpu_kernel_taller": the prefill kernels of taller query tiles its plan takes instead where
    the requests' lengths allow (empty where none, or where KVATTN_CPU_KERNEL decides), and
    "cpu_kernel_one_token": the decode kernel a paged batch prefill's plan runs where every request
    has one query token (null for the other ops, or where KVATTN_CPU_KERNEL names a prefill
    kernel). `op` and the keywords are the command line's names in snake case (num_qo_heads,
    head_dim_qk, causal, q_data_type, ...); dtypes as in `plan`; device "cpu" or a described GPU
    such as "cuda:sm90"."""
    return _kvattn.explain(_problem(op, problem), device)


def select_backend(op: str, *, device: str = "cpu", backend: str = "auto",
                   **problem: Any) -> str:
    """The backend that would run the problem (raises NotSupportedError / UnavailableError with
    the reason when `backend` cannot)."""
    return _kvattn.select_backend(_problem(op, problem), device, backend)


def backend_names() -> List[str]:
    return list(_kvattn.backend_names())


def devices() -> Dict[str, Any]:
    """This machine's CPU ISA and threads, and its CUDA devices (or why there are none)."""
    return dict(_kvattn.devices())
