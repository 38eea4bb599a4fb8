"""An engine with an injected fault: it raises whenever one marked request is in a step.

The mark is a seed (`POISON_SEED`), so a tenant can set it over HTTP. The fault
fires once the marked request has produced two tokens, so that it strikes in
the middle of other requests' decodes. Module level, so that a ProcessEngine's
child can build it from a `functools.partial`.
"""

from __future__ import annotations

from typing import Any

from engine.llm_engine import LLMEngine
from engine.runner.model_runner import PreparedStep
from engine.scheduler.output import SchedulerOutput

POISON_SEED = 666_013
# What the fault says; it must never reach a tenant.
SECRET = "index 0 is out of bounds (internal detail)"


def _poisoned(output: SchedulerOutput) -> bool:
    return any(
        item.seq.params.seed == POISON_SEED and item.seq.num_output_tokens >= 2
        for item in output.scheduled
    )


def inject_fault(engine: LLMEngine, where: str = "runner") -> LLMEngine:
    """Makes `engine`'s model runner (`where="runner"`: its synchronous `execute` and
    its overlapped `run`) or sampler raise on the mark."""
    runner = engine.runner
    if where == "runner":
        real_execute = runner.execute

        def execute(output: SchedulerOutput) -> Any:
            if _poisoned(output):
                raise RuntimeError(SECRET)
            return real_execute(output)

        runner.execute = execute  # type: ignore[method-assign]
        real_run = runner.run

        # A step launched ahead (overlap scheduling) raises too.
        def run(step: PreparedStep, previous: Any) -> Any:
            if any(s.params.seed == POISON_SEED and s.num_output_tokens >= 2 for s in step.seqs):
                raise RuntimeError(SECRET)
            return real_run(step, previous)

        runner.run = run  # type: ignore[method-assign]
    elif where == "sampler":
        real_sample = runner.sampler.sample

        def sample(logits: Any, rows: Any, *mask: Any) -> Any:
            if any(r.params.seed == POISON_SEED and len(r.output_token_ids) >= 2 for r in rows):
                raise IndexError(SECRET)
            return real_sample(logits, rows, *mask)

        runner.sampler.sample = sample  # type: ignore[method-assign]
    else:
        raise ValueError(f"no fault site {where!r}")
    return engine


def faulty_engine(folder: str, where: str = "runner", **options: Any) -> LLMEngine:
    """A new engine over the model in `folder`, with the fault injected at `where`."""
    return inject_fault(LLMEngine.from_options(folder, **options), where)
