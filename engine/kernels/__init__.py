"""Triton kernels of the engine, one kernel family per module.

kv_write (paged K/V store), decode_attention (GQA, split-K), prefill_attention
(varlen over the paged cache), fused_ops (RMSNorm+residual, rotary, SiLU-and-mul).
Nothing is imported here on purpose: triton reads TRITON_INTERPRET when a kernel
module is first imported, so callers decide when that happens.
"""
