"""CUDA graphs for pure-decode steps: static buffers, size buckets, padding, replay.

A decode step launches a few hundred small kernels; replaying a captured graph
launches them all with one call. A graph fixes every tensor address and every
Python-side decision, so one graph is captured per batch size bucket, all of them
reading one set of static input buffers sized for the largest bucket:

    real batch (n = 5)         bucket = 8 (next captured size)
    input_ids   a b c d e   |  0  0  0         padding rows: token 0, position 0,
    positions   . . . . .   |  0  0  0         slot -1 (no KV write), seq_len 1,
    slot_mapping. . . . .   | -1 -1 -1         block table row all 0 (reads block 0,
    seq_lens    . . . . .   |  1  1  1         which always exists; output unused)
    block_tables[8, max_blocks_per_seq]: rows n.. zeroed

The metadata's host fields are fixed at capture: `max_seq_len = max_model_len`, so
the triton backend's split-K choice holds for any context a replay may see (empty
splits weigh nothing), and `query_lens_cpu` says "every row adds one token".

Replay runs no Python, so a captured graph needs a backend that takes every length
from device tensors: the triton backend does; the torch reference reads
`seq_lens_cpu` and so only ever runs this path eagerly. On the CPU (and with
`use_graphs=False`) `run` executes the same padded static-buffer forward eagerly
with the real host lengths; tests compare that with the unpadded eager step.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence

import torch

from engine.attention.backend import AttentionBackend, AttentionMetadata
from engine.model.forward_context import ForwardContext

PAD_SLOT = -1
PAD_SEQ_LEN = 1  # >= 1 keeps the torch reference finite; the triton kernels accept 0 too


def capture_sizes(max_batch: int) -> tuple[int, ...]:
    """Bucket sizes 1, 2, 4, 8, 16, 24, 32, ... up to `max_batch` (always included)."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    sizes = [s for s in (1, 2, 4) if s <= max_batch]
    sizes += list(range(8, max_batch + 1, 8))
    if sizes[-1] != max_batch:
        sizes.append(max_batch)
    return tuple(sizes)


def pick_bucket(sizes: Sequence[int], num_seqs: int) -> int | None:
    """The smallest captured size >= num_seqs, or None when the batch is too big."""
    at = bisect.bisect_left(sizes, num_seqs)
    return sizes[at] if at < len(sizes) else None


class DecodeGraphRunner:
    """Runs pure-decode steps through per-bucket CUDA graphs (or the same path eagerly).

    Contract: `can_run(meta)` says whether a step qualifies (every sequence adds one
    token, at most the largest bucket); `run` then returns the final hidden states of
    the real rows, [num_seqs, hidden], equal to an eager forward of the same step.
    The returned tensor is a view of graph memory, valid until the next `run`.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        backend: AttentionBackend,
        kv_caches: Sequence[torch.Tensor],
        *,
        max_batch: int,
        max_model_len: int,
        block_size: int,
        device: torch.device,
        use_graphs: bool,
    ) -> None:
        self.model = model
        self.backend = backend
        self.kv_caches = kv_caches
        self.sizes = capture_sizes(max_batch)
        self.max_model_len = max_model_len
        self.max_blocks_per_seq = -(-max_model_len // block_size)
        self.device = device
        self.use_graphs = use_graphs and device.type == "cuda"
        largest = self.sizes[-1]

        def buf(*shape: int, dtype: torch.dtype, fill: int) -> torch.Tensor:
            return torch.full(shape, fill, dtype=dtype, device=device)

        self.input_ids = buf(largest, dtype=torch.int64, fill=0)
        self.positions = buf(largest, dtype=torch.int64, fill=0)
        self.slot_mapping = buf(largest, dtype=torch.int64, fill=PAD_SLOT)
        self.seq_lens = buf(largest, dtype=torch.int32, fill=PAD_SEQ_LEN)
        self.block_tables = buf(largest, self.max_blocks_per_seq, dtype=torch.int32, fill=0)
        # One token per row, so query_start_loc is the same arange for every step.
        self.query_start_loc = torch.arange(largest + 1, dtype=torch.int32, device=device)
        self._metas = {size: self._static_meta(size) for size in self.sizes}
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[int, torch.Tensor] = {}

    def _static_meta(self, size: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:size],
            query_start_loc=self.query_start_loc[: size + 1],
            seq_lens=self.seq_lens[:size],
            block_tables=self.block_tables[:size],
            max_query_len=1,
            max_seq_len=self.max_model_len,
            query_lens_cpu=(1,) * size,
            seq_lens_cpu=(self.max_model_len,) * size,
        )

    @property
    def captured_sizes(self) -> tuple[int, ...]:
        """Sizes that replay a graph (empty until `capture`, and always on the CPU)."""
        return tuple(sorted(self._graphs))

    def can_run(self, meta: AttentionMetadata) -> bool:
        """True for a pure-decode step that fits a bucket and the static block tables."""
        n = meta.num_seqs
        return (
            n > 0
            and meta.max_query_len == 1
            and sum(meta.query_lens_cpu) == n
            and n <= self.sizes[-1]
            and meta.max_seq_len <= self.max_model_len
            and meta.block_tables.shape[1] <= self.max_blocks_per_seq
        )

    def load(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> int:
        """Copies a step into the static buffers, padding it to its bucket; returns the bucket."""
        n = meta.num_seqs
        bucket = pick_bucket(self.sizes, n)
        if bucket is None or not self.can_run(meta):
            raise ValueError(f"a {n}-sequence step does not fit the decode graphs")
        # Device-to-device copies only: nothing here waits for the GPU.
        self.input_ids[:n].copy_(input_ids, non_blocking=True)
        self.positions[:n].copy_(positions, non_blocking=True)
        self.slot_mapping[:n].copy_(meta.slot_mapping, non_blocking=True)
        self.seq_lens[:n].copy_(meta.seq_lens, non_blocking=True)
        width = meta.block_tables.shape[1]
        self.block_tables[:n, :width].copy_(meta.block_tables, non_blocking=True)
        self.block_tables[:n, width:].zero_()
        if bucket > n:
            self.input_ids[n:bucket].zero_()
            self.positions[n:bucket].zero_()
            self.slot_mapping[n:bucket].fill_(PAD_SLOT)
            self.seq_lens[n:bucket].fill_(PAD_SEQ_LEN)
            self.block_tables[n:bucket].zero_()
        return bucket

    def _forward(self, size: int, meta: AttentionMetadata | None = None) -> torch.Tensor:
        meta = meta or self._metas[size]
        ctx = ForwardContext(backend=self.backend, meta=meta, kv_caches=self.kv_caches)
        hidden: torch.Tensor = self.model(self.input_ids[:size], self.positions[:size], ctx)
        return hidden

    def run(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """Final hidden states [num_seqs, hidden] of one pure-decode step."""
        bucket = self.load(input_ids, positions, meta)
        graph = self._graphs.get(bucket)
        if graph is None:
            # Eager, so the host fields may be the real ones: the torch reference reads
            # seq_lens_cpu to gather a single sequence's context.
            pad = (PAD_SEQ_LEN,) * (bucket - meta.num_seqs)
            real = dataclasses.replace(
                self._metas[bucket], seq_lens_cpu=tuple(meta.seq_lens_cpu) + pad
            )
            hidden = self._forward(bucket, real)
        else:
            graph.replay()
            hidden = self._outputs[bucket]
        return hidden[: meta.num_seqs]

    def replay(self, size: int) -> torch.Tensor:
        """Replays the graph of bucket `size` on whatever the buffers hold (benchmarks).

        Idempotent after a `run` of that bucket: the same K/V land in the same slots.
        """
        self._graphs[size].replay()
        return self._outputs[size]

    def capture(self) -> None:
        """Captures one graph per bucket, largest first, sharing one memory pool.

        The buffers hold padding (slot -1) while capturing, so warm-up and capture
        never write the KV cache. A no-op unless `use_graphs` on a CUDA device with a
        backend whose kernels read lengths from the device (the triton backend).
        """
        if not self.use_graphs or self.backend.name != "triton":
            return
        self.load_padding()
        pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.sizes):
            # Warm-up compiles the triton kernels and lets cuBLAS pick its algorithms:
            # neither may happen during capture.
            for _ in range(2):
                self._forward(size)
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._outputs[size] = self._forward(size)
            self._graphs[size] = graph
        torch.cuda.synchronize(self.device)

    def load_padding(self) -> None:
        """Fills every static buffer with padding values."""
        self.input_ids.zero_()
        self.positions.zero_()
        self.slot_mapping.fill_(PAD_SLOT)
        self.seq_lens.fill_(PAD_SEQ_LEN)
        self.block_tables.zero_()
