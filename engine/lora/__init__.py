"""LoRA adapters: PEFT loading, device slots and the batched (per-row adapter) matmul."""
