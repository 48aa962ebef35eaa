"""Sampling transforms and draws: the float64 reference (numpy), the device path the decoder
runs, top-k rows kept as their entries, per-row reductions, what a record keeps of a row, and
replayed draws. The reference's names are re-exported here (numpy only, no torch)."""

from specscope.core.sampling.reference import SamplingConfig, process_logits, sample_from

__all__ = ["SamplingConfig", "process_logits", "sample_from"]
