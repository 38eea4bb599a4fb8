"""Request-level state: the `n` samples of one request, their text and their stream deltas."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.detokenizer import IncrementalDetokenizer
from engine.model.tokenizer import Tokenizer
from engine.outputs import (
    CompletionDelta,
    CompletionOutput,
    PositionLogprobs,
    RequestMetrics,
    RequestOutput,
    StreamEvent,
    TokenLogprob,
)
from engine.runner.model_runner import SampledToken
from engine.sequence import Sequence


@dataclass
class _SampleState:
    seq: Sequence
    detok: IncrementalDetokenizer
    output: CompletionOutput
    pending_text: str = ""
    pending_ids: list[int] = field(default_factory=list)
    pending_logprobs: list[PositionLogprobs] = field(default_factory=list)
    reported_finish: bool = False


class RequestState:
    """Turns the tokens of a request's sequences into text, deltas and final outputs."""

    def __init__(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        seqs: list[Sequence],
        tokenizer: Tokenizer,
        arrival_time: float,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        # Built once: every stream event carries it, and a copy per event per step
        # would cost O(prompt) each (and feed the garbage collector big young tuples).
        self._prompt_tuple = tuple(prompt_token_ids)
        self.tokenizer = tokenizer
        self.arrival_time = arrival_time
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.finished_time: float | None = None
        self.samples = [
            _SampleState(
                seq=seq,
                detok=IncrementalDetokenizer(
                    tokenizer,
                    prompt_token_ids=prompt_token_ids,
                    skip_special_tokens=seq.params.skip_special_tokens,
                    stop=seq.params.stop,
                ),
                output=CompletionOutput(
                    index=seq.index, logprobs=[] if seq.params.logprobs is not None else None
                ),
            )
            for seq in seqs
        ]
        self._by_seq = {s.seq.seq_id: s for s in self.samples}

    @property
    def seqs(self) -> list[Sequence]:
        """The request's sequences, by sample index."""
        return [s.seq for s in self.samples]

    @property
    def finished(self) -> bool:
        """True when every sample has finished."""
        return all(s.seq.is_finished for s in self.samples)

    @property
    def num_cached_tokens(self) -> int:
        """Prompt tokens served from the prefix cache (the first sample's admission)."""
        return self.samples[0].seq.num_cached_tokens

    def add_token(self, seq: Sequence, sampled: SampledToken, now: float) -> str | None:
        """Records a sampled token; returns the stop string if the text just hit one."""
        if self.first_token_time is None:
            self.first_token_time = now
        sample = self._by_seq[seq.seq_id]
        sample.pending_ids.append(sampled.token_id)
        sample.output.token_ids.append(sampled.token_id)
        if sample.output.logprobs is not None and sampled.logprob is not None:
            entry = PositionLogprobs(
                chosen=self._token_logprob(sampled.token_id, sampled.logprob),
                top=tuple(self._token_logprob(t, lp) for t, lp in sampled.top_logprobs),
            )
            sample.output.logprobs.append(entry)
            sample.pending_logprobs.append(entry)
        text = sample.detok.push([sampled.token_id])
        sample.pending_text += text
        sample.output.text += text
        if sample.detok.stopped:
            return str(sample.detok.stop_reason)
        return None

    def _token_logprob(self, token_id: int, logprob: float) -> TokenLogprob:
        text = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return TokenLogprob(token_id=token_id, logprob=logprob, text=text)

    def take_event(self, now: float) -> StreamEvent | None:
        """The deltas since the last event, or None when nothing moved."""
        deltas: list[CompletionDelta] = []
        for sample in self.samples:
            seq = sample.seq
            newly_finished = seq.is_finished and not sample.reported_finish
            if newly_finished:
                sample.output.finish_reason = seq.finish_reason
                sample.output.stop_reason = seq.stop_reason
                if not sample.detok.stopped:
                    tail = sample.detok.flush()
                    sample.pending_text += tail
                    sample.output.text += tail
                sample.reported_finish = True
            if not (sample.pending_ids or sample.pending_text or newly_finished):
                continue
            deltas.append(
                CompletionDelta(
                    index=sample.output.index,
                    text=sample.pending_text,
                    token_ids=tuple(sample.pending_ids),
                    logprobs=tuple(sample.pending_logprobs)
                    if sample.output.logprobs is not None
                    else None,
                    finish_reason=seq.finish_reason if newly_finished else None,
                )
            )
            sample.pending_text, sample.pending_ids, sample.pending_logprobs = "", [], []
        if not deltas:
            return None
        finished = self.finished
        if finished and self.finished_time is None:
            self.finished_time = now
        return StreamEvent(
            request_id=self.request_id,
            deltas=tuple(deltas),
            prompt_token_ids=self._prompt_tuple,
            num_cached_tokens=self.num_cached_tokens,
            finished=finished,
            metrics=self.metrics() if finished else None,
        )

    def metrics(self) -> RequestMetrics:
        """Timing so far."""
        return RequestMetrics(
            arrival_time=self.arrival_time,
            first_scheduled_time=self.first_scheduled_time,
            first_token_time=self.first_token_time,
            finished_time=self.finished_time,
            num_preemptions=sum(s.seq.num_preemptions for s in self.samples),
        )

    def to_output(self) -> RequestOutput:
        """The request's outputs as `LLM.generate` returns them."""
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=list(self.prompt_token_ids),
            outputs=[s.output for s in self.samples],
            num_cached_tokens=self.num_cached_tokens,
            finished=self.finished,
            metrics=self.metrics(),
        )
