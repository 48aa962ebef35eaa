"""The fault zoo: deliberate, documented speculative-decoding bugs, injected through the decoder's seams."""

from specscope.core.faults.zoo import FAULTS, Fault, faulty_decoder

__all__ = ["FAULTS", "Fault", "faulty_decoder"]
