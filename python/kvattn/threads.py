"""Where kvattn's CPU work runs: its own worker threads, or the OpenMP team of the process.

Inside torch (and vLLM's CPU worker, and anything on oneDNN) the OpenMP runtime's workers keep
spinning on the cores for a while after every op; a second pool of threads started right after
competes with them for the same cores. So by default ("auto") kvattn runs its work items on the
OpenMP team that is loaded in the process — torch's, once torch is imported — and on its own
threads only where there is none (numpy alone). kvattn-specific: FlashInfer has no counterpart.
"""

from __future__ import annotations

from . import _kvattn

__all__ = ["set_cpu_threads", "cpu_threads", "host_openmp_runtime"]


def set_cpu_threads(mode: str) -> None:
    """Process-wide. ``"auto"`` (the default): the host's OpenMP team whenever one is loaded,
    else kvattn's own threads; ``"openmp"``: the host's OpenMP team (``UnavailableError`` when no
    OpenMP runtime is loaded); ``"own"``: kvattn's own threads (after each job they spin for
    ``KVATTN_CPU_SPIN_US`` microseconds of the environment, 50 by default, before they sleep).
    ``num_threads`` keeps its meaning either way (0: every core)."""
    _kvattn.set_cpu_threads(mode)


def cpu_threads() -> str:
    """The current mode: ``"auto"``, ``"openmp"`` or ``"own"``."""
    return _kvattn.cpu_threads()


def host_openmp_runtime() -> str:
    """The file of the OpenMP runtime kvattn runs on in "auto"/"openmp" mode ("" if none is
    loaded)."""
    return _kvattn.host_openmp_runtime()
