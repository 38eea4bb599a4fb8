"""How often a tenant's prompt chunks may ride in steps that carry other tenants' decodes.

The contended cap (step_budget.py) bounds one step's prompt tokens to about what the
step's decodes cost, and a step never carries fewer than `MIN_PREFILL_TOKENS` of them.
On a CPU a decode step is memory-bound and a prompt chunk compute-bound: sixteen prompt
tokens of SmolLM2 in fp32 cost about 0.6 of a one-row decode step. So a tenant that
keeps prompts in flight (a flood of long one-token prompts) put a chunk into every
step, and every other tenant's next token waited 1.5-2 decode steps: its median
inter-token latency grew by half or more, whatever the cap.

So a tenant whose prompt chunk rode beside another tenant's decode rows then sits out
as many steps as make its chunks' cost, over time, at most `CONTENDED_PROMPT_SHARE` of
the decode steps they ride in: a chunk that cost 0.6 of a decode step rests about two
steps. The other tenants' tokens then come at decode pace in most steps, and about one
step in three or four is longer, by one chunk. A tenant is held only while another
tenant decodes (holding it otherwise would leave the step empty), and its prompts beside
its own decodes alone are never charged, so a lone client's long prompt goes at the
budget's full pace. The price: beside another tenant's decodes, a long prompt advances
at about a quarter of a decode step's time per step, so its time to first token grows
(a newcomer's first chunk still goes in the step it arrives, `Scheduler._newcomers`).

The cost of a chunk is measured where it ran: what its step took beyond the step
budget's median decode step of as many rows, shared among the step's chunks by their
tokens. (An estimate per prompt token is learned from large chunks only, and a
contended step's chunks are small, where the cost per token differs.) Until a decode
step of as many rows is measured, a chunk beside other tenants' decodes rests one
step, so that decode-only steps happen and the figure comes. The debt is kept in
steps; a tenant banks at most one step of credit, so an idle spell buys no burst.
"""

from __future__ import annotations

from collections.abc import Mapping

from engine.scheduler.output import SchedulerOutput
from engine.scheduler.step_budget import StepBudget

# The share of a decode step that other tenants' prompt chunks may add, on average,
# to the steps that carry a tenant's decodes. With a victim's time alone at 1, its
# mean inter-token time beside a flood is then at most about 1 + this.
CONTENDED_PROMPT_SHARE = 0.25
# The most credit (in steps) a tenant keeps while it sends no chunk.
MAX_CREDIT_STEPS = 1.0
# The most one step's chunks are charged, in decode steps of as many rows.
MAX_CHUNK_DECODES = 1.0


class PromptDuty:
    """Per tenant, the steps its prompt chunks still owe (positive: it sits out)."""

    def __init__(self, share: float = CONTENDED_PROMPT_SHARE) -> None:
        if not share > 0:
            raise ValueError("the contended prompt share must be positive")
        self.share = share
        self._debt: dict[str, float] = {}

    def resting(self) -> set[str]:
        """The tenants whose prompt chunks sit the next step out."""
        return {key for key, debt in self._debt.items() if debt > 0}

    def observe(
        self,
        charged: Mapping[str, int],
        prompt_tokens: int,
        extra_s: float | None,
        decode_s: float | None,
    ) -> None:
        """One finished step: `charged` the prompt tokens of each tenant whose chunks rode
        beside other tenants' decodes, `prompt_tokens` all the step's prompt tokens, and
        `extra_s` what the step took beyond `decode_s` (the step budget's median decode
        step of as many rows); None where not yet measured."""
        for key in list(self._debt):
            self._debt[key] -= 1.0
            if self._debt[key] <= -MAX_CREDIT_STEPS:
                del self._debt[key]
        for key, tokens in charged.items():
            if tokens <= 0:
                continue
            debt = self._debt.get(key, 0.0)
            if extra_s is None or decode_s is None or decode_s <= 0 or prompt_tokens <= 0:
                self._debt[key] = max(debt, 0.0) + 1.0
                continue
            # The step's time beyond its decodes, each tenant's part by its tokens. The
            # contended cap keeps a chunk near one decode step's cost; a step that took
            # far longer was stalled by something else (a pause, a slow mask), and one
            # such step must not hold a tenant's prompts for hundreds of steps.
            cost = min(max(extra_s, 0.0) * tokens / prompt_tokens, MAX_CHUNK_DECODES * decode_s)
            self._debt[key] = debt + cost / (self.share * decode_s)

    def observe_step(self, output: SchedulerOutput, elapsed_s: float, budget: StepBudget) -> None:
        """`observe` for one finished step of the scheduler: its prompt chunks that rode
        beside other tenants' decodes are charged with what it took beyond its decodes."""
        chunks: dict[str, int] = {}
        decoders: set[str] = set()
        rows = 0
        for item in output.scheduled:
            key = item.seq.fairness_key
            if item.num_prompt_tokens:
                chunks[key] = chunks.get(key, 0) + item.num_prompt_tokens
            else:
                if not item.seq.batch:  # batch decodes are owed nothing (traffic.py)
                    decoders.add(key)
                rows += 1
        charged = {key: tokens for key, tokens in chunks.items() if decoders - {key}}
        decode = budget.decode_estimate(rows) if rows else 0.0
        extra = elapsed_s - decode if decode > 0 else None
        self.observe(charged, sum(chunks.values()), extra, decode or None)

    def clear(self) -> None:
        """The engine went idle: nobody owes anything."""
        self._debt.clear()
