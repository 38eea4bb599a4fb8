"""Everything on the device: the KV tensors, the forward pass and sampling.

Per step the host waits for the device once: when the sampled token ids (and the
logprobs, when asked for) come back. Pure-decode steps replay a CUDA graph when
`capture_decode_graphs` was called on a CUDA device; all other steps run eagerly.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

from engine.attention.backend import AttentionBackend
from engine.config import ModelArchitecture
from engine.lora.batch import LoraBatch
from engine.lora.manager import LoraManager
from engine.model.forward_context import ForwardContext
from engine.model.llama import LlamaForCausalLM
from engine.runner.block_table import BlockTable
from engine.runner.cuda_graphs import DecodeGraphRunner
from engine.runner.inputs import StepInputs, build_step_inputs
from engine.sampling import Sampler, SamplingRow, make_generator
from engine.sampling.penalties import needs_adjustment
from engine.scheduler.output import ScheduledSequence, SchedulerOutput
from engine.sequence import Sequence
from engine.speculative.verify import verify_greedy, verify_sampled
from engine.structured.compiler import GrammarCompiler
from engine.structured.matchers import MatcherTable, PendingMasks

# The weight of the newest step in `ModelRunner.forward_s`: a few steps' memory, so one
# slow step (a first compile, a page fault) does not turn overlap back on by itself.
FORWARD_EWMA = 0.25


@dataclass(frozen=True)
class SampledToken:
    """A token chosen for one sequence, with its logprobs when they were asked for."""

    token_id: int
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()
    grammar_complete: bool = False  # the sequence's grammar accepts nothing more: it ends
    # Why the sequence's constraint can go no further (a dead end, a parser limit, its mask
    # budget): `token_id` is then meaningless, and the sequence ends without it.
    constraint_ended: str | None = None
    # A verify row's accepted draft tokens, which come before `token_id` (speculative
    # decoding); () for every other row.
    accepted: tuple[int, ...] = ()
    # Uniforms a sampled verify row drew beyond one per emitted token (1 after a rejection).
    extra_draws: int = 0


@dataclass(frozen=True)
class PreparedStep:
    """A plain step's inputs, adapter rows and sampling rows, built before it runs."""

    inputs: StepInputs
    lora: LoraBatch | None
    seqs: tuple[Sequence, ...]  # the sequences that sample, in logits-row order
    rows: tuple[SamplingRow, ...]


class ModelRunner:
    """Runs the model on a step's flat batch and samples the sequences that reached their end.

    It makes no scheduling decision: it does exactly what `SchedulerOutput` says.
    """

    def __init__(
        self,
        model: LlamaForCausalLM,
        arch: ModelArchitecture,
        backend: AttentionBackend,
        *,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
        eos_token_ids: frozenset[int],
        grammars: GrammarCompiler | None = None,
    ) -> None:
        self.model = model
        self.arch = arch
        self.backend = backend
        self.block_size = block_size
        self.device = device
        self.eos_token_ids = eos_token_ids
        shape = (2, num_blocks, block_size, arch.num_kv_heads, arch.head_dim)
        # Allocated once; block ids from the pool index dimension 1.
        self.kv_caches = [
            torch.zeros(shape, dtype=dtype, device=device) for _ in range(arch.num_layers)
        ]
        self.sampler = Sampler()
        self._generators: dict[str, torch.Generator] = {}
        # Matchers of the structured sequences; batches without one never look at it.
        self.matchers = MatcherTable(grammars, pin_memory=device.type == "cuda")
        # Host copy of the live sequences' block tables, updated by diffs each step.
        self.block_table = BlockTable()
        self.graphs: DecodeGraphRunner | None = None
        # Set by the engine when it serves adapters: builds each step's LoRA rows.
        self.lora: LoraManager | None = None
        # Seconds a step's forward pass and sampling take, smoothed over sampling steps
        # (None before the first): overlap scheduling runs steps in turn while it is short.
        self.forward_s: float | None = None

    def capture_decode_graphs(self, max_batch: int, max_model_len: int) -> tuple[int, ...]:
        """Captures CUDA graphs for decode batches up to `max_batch`; returns their sizes.

        A no-op on the CPU (returns ()): there every step runs eagerly.
        """
        if self.device.type != "cuda":
            return ()
        graphs = DecodeGraphRunner(
            self.model,
            self.backend,
            self.kv_caches,
            max_batch=max_batch,
            max_model_len=max_model_len,
            block_size=self.block_size,
            device=self.device,
            use_graphs=True,
        )
        with torch.inference_mode():
            graphs.capture()
        self.graphs = graphs
        return graphs.captured_sizes

    @torch.inference_mode()
    def execute(self, output: SchedulerOutput) -> dict[str, SampledToken]:
        """Runs one step; returns the sampled token of every sequence that samples."""
        inputs = build_step_inputs(output, self.block_size, self.device, self.block_table)
        lora = self.lora.batch(output) if self.lora is not None else None
        items = [output.scheduled[i] for i in inputs.sampling_positions]
        # Verify rows (drafts) never have a grammar: only the others take masks.
        seqs = [item.seq for item in items if not item.spec]
        # Grammar masks are filled on the host while the forward runs (on any device).
        pending = self.matchers.start_masks(seqs)
        began = time.perf_counter()
        try:
            hidden = self._forward(inputs, lora)
        except BaseException:
            if pending is not None:  # a retried step rewinds the matchers: let it finish
                concurrent.futures.wait([pending.future])
            raise
        if not inputs.sampling_positions:
            return {}
        logits = self.model.compute_logits(hidden[inputs.logits_indices])
        if not inputs.rows_per_seq:
            sampled = self._sample(seqs, logits, pending)
            self._note_forward(began)
            return sampled
        # Each sequence's first logits row; a verify row's k + 1 rows follow it.
        first = [0]
        for count in inputs.rows_per_seq[:-1]:
            first.append(first[-1] + count)
        plain = [f for f, item in zip(first, items, strict=True) if not item.spec]
        sampled = self._sample(seqs, logits[plain], pending) if seqs else {}
        verify = [(item, f) for f, item in zip(first, items, strict=True) if item.spec]
        sampled.update(self._verify(verify, logits))
        self._note_forward(began)
        return sampled

    @torch.inference_mode()
    def prepare(self, output: SchedulerOutput) -> PreparedStep:
        """Overlap scheduling: everything of a plain step (no grammar, no drafts, no
        penalties) the host does before the forward pass, usually on the host thread
        while the step before runs (engine/overlap.py).

        The sampling rows are taken now: the sequences' outputs grow on the host thread
        while `run` executes.
        """
        inputs = build_step_inputs(output, self.block_size, self.device, self.block_table)
        lora = self.lora.batch(output) if self.lora is not None else None
        seqs = tuple(output.scheduled[i].seq for i in inputs.sampling_positions)
        rows = tuple(self._row(seq) for seq in seqs)
        return PreparedStep(inputs, lora, seqs, rows)

    @torch.inference_mode()
    def run(
        self, step: PreparedStep, previous: Mapping[str, SampledToken]
    ) -> dict[str, SampledToken]:
        """Runs a prepared step; `previous` (the step before's tokens) fills its pending
        input tokens first. On the engine's thread, as `execute` runs."""
        inputs = step.inputs
        if inputs.pending:
            where = torch.tensor([i for i, _ in inputs.pending], dtype=torch.long)
            tokens = torch.tensor([previous[s].token_id for _, s in inputs.pending])
            inputs.input_ids[where.to(self.device)] = tokens.to(self.device)
        began = time.perf_counter()
        hidden = self._forward(inputs, step.lora)
        if not step.seqs:
            return {}
        logits = self.model.compute_logits(hidden[inputs.logits_indices])
        sampled = self._sample(list(step.seqs), logits, None, list(step.rows))
        self._note_forward(began)
        return sampled

    def _note_forward(self, began: float) -> None:
        """Folds a step's forward pass and sampling, from `began` until its tokens are on
        the host (so a GPU's queued work is in it), into `forward_s`."""
        took = time.perf_counter() - began
        last = self.forward_s
        self.forward_s = took if last is None else last + FORWARD_EWMA * (took - last)

    def _verify(
        self, rows: list[tuple[ScheduledSequence, int]], logits: torch.Tensor
    ) -> dict[str, SampledToken]:
        """The verdicts of the verify rows, each given with its first logits row."""
        out: dict[str, SampledToken] = {}
        greedy = [(item, f) for item, f in rows if item.seq.params.greedy]
        if greedy:
            index = [f + j for item, f in greedy for j in range(len(item.spec) + 1)]
            targets = logits[index].argmax(dim=-1).tolist()
            at = 0
            for item, _ in greedy:
                width = len(item.spec) + 1
                verdict = verify_greedy(targets[at : at + width], item.spec)
                at += width
                out[item.seq.seq_id] = SampledToken(verdict.token, accepted=verdict.accepted)
        for item, f in rows:
            seq = item.seq
            if seq.params.greedy:
                continue
            row = self._row(seq)
            verdict = verify_sampled(logits[f : f + len(item.spec) + 1], item.spec, row)
            # A rejection costs one uniform more than the tokens it emits (see `rewind`).
            extra = verdict.draws - len(verdict.emitted)
            out[seq.seq_id] = SampledToken(
                verdict.token, accepted=verdict.accepted, extra_draws=extra
            )
        return out

    def _sample(
        self,
        seqs: list[Sequence],
        logits: torch.Tensor,
        pending: PendingMasks | None,
        rows: list[SamplingRow] | None = None,
    ) -> dict[str, SampledToken]:
        """Samples one token per sequence from its logits row (no drafts); `rows`, when
        given, were taken before (`prepare`)."""
        if rows is None:
            rows = [self._row(seq) for seq in seqs]
        mask = None if pending is None else self.matchers.finish_masks(pending)
        if mask is None and _plain_greedy(rows):
            # The common decode case needs no sampler: one argmax, one copy to the host.
            return {
                seq.seq_id: SampledToken(token)
                for seq, token in zip(seqs, logits.argmax(dim=-1).tolist(), strict=True)
            }
        # Two arguments when there is no mask: wrappers of `sample` (tests) keep working.
        result = (
            self.sampler.sample(logits, rows)
            if mask is None
            else (self.sampler.sample(logits, rows, mask))
        )
        complete, ended = (
            (set(), {}) if mask is None else self.matchers.consume(seqs, result.token_ids, mask)
        )
        sampled: dict[str, SampledToken] = {}
        for seq, token, lp in zip(seqs, result.token_ids, result.logprobs, strict=True):
            done = seq.seq_id in complete
            why = ended.get(seq.seq_id)
            if why is not None:
                sampled[seq.seq_id] = SampledToken(token, constraint_ended=why)
            elif lp is None:
                sampled[seq.seq_id] = SampledToken(token, grammar_complete=done)
            else:
                chosen, top = lp
                sampled[seq.seq_id] = SampledToken(token, chosen, tuple(top), done)
        return sampled

    def _forward(self, inputs: StepInputs, lora: LoraBatch | None = None) -> torch.Tensor:
        """Final hidden states of the step: a graph replay for decode when captured
        (graphs hold no adapter rows, so a step with any runs eagerly)."""
        if lora is None and self.graphs is not None and self.graphs.can_run(inputs.meta):
            return self.graphs.run(inputs.input_ids, inputs.positions, inputs.meta)
        ctx = ForwardContext(
            backend=self.backend, meta=inputs.meta, kv_caches=self.kv_caches, lora=lora
        )
        hidden: torch.Tensor = self.model(inputs.input_ids, inputs.positions, ctx)
        return hidden

    def _row(self, seq: Sequence) -> SamplingRow:
        gen = self._generators.get(seq.seq_id)
        if gen is None:
            gen = make_generator(seq.params.seed, seq.index, self.device)
            self._generators[seq.seq_id] = gen
        suppress = (
            self.eos_token_ids | frozenset(seq.params.stop_token_ids)
            if seq.num_output_tokens < seq.params.min_tokens
            else frozenset()
        )
        return SamplingRow(
            params=seq.params,
            generator=gen,
            prompt_token_ids=seq.prompt_token_ids,
            output_token_ids=seq.output_token_ids,
            suppress_eos=suppress,
            state_key=seq.seq_id,
        )

    def rewind(self, items: Iterable[ScheduledSequence]) -> None:
        """Puts the random state of these rows back where it was before the step ran.

        For a retry of part of a failed step (engine.fronts.step_isolation). A sampled row
        (temperature > 0) draws one uniform per output token, and one more for each
        verify row that rejected a draft (`Sequence.spec_extra_draws`), so its
        generator is rebuilt from its seed and advanced by that many draws; greedy
        rows never draw. Costs O(output tokens) per sampled row, on retries only.
        A structured row's matcher is rolled back to the row's output tokens.
        """
        for item in items:
            seq = item.seq
            self.matchers.rewind(seq)
            old = self._generators.get(seq.seq_id)
            if old is None or seq.params.greedy:
                continue
            fresh = torch.Generator(device=old.device)
            fresh.manual_seed(old.initial_seed())
            for _ in range(seq.num_output_tokens + seq.spec_extra_draws):
                torch.rand((), generator=fresh, dtype=torch.float64, device=fresh.device)
            self._generators[seq.seq_id] = fresh

    @torch.inference_mode()
    def scrub_blocks(self, block_ids: list[int]) -> None:
        """Zeroes the K and V of `block_ids` in every layer (blocks leaving a cache domain)."""
        if not block_ids:
            return
        index = torch.tensor(sorted(set(block_ids)), dtype=torch.long, device=self.device)
        for cache in self.kv_caches:
            cache.index_fill_(1, index, 0)

    def release(self, seq_id: str) -> None:
        """Forgets a finished sequence's sampling state (generator, penalty counts,
        matcher) and block-table row. A preempted sequence keeps them all: its history
        is unchanged."""
        self._generators.pop(seq_id, None)
        self.matchers.release(seq_id)
        self.sampler.release(seq_id)
        self.block_table.release(seq_id)


def _plain_greedy(rows: list[SamplingRow]) -> bool:
    """Rows whose token is the argmax of the raw logits: greedy, no logprobs, no adjustment."""
    return all(r.params.greedy and r.params.logprobs is None for r in rows) and not (
        needs_adjustment(rows)
    )
