"""Scheduler behaviour on a fake model: budgets, chunking, admission, preemption."""

from tests.utils.scheduler_driver import Driver, next_token


def expected_output(prompt: list[int], max_tokens: int) -> list[int]:
    history = list(prompt)
    out = []
    for _ in range(max_tokens):
        tok = next_token(history)
        history.append(tok)
        out.append(tok)
    return out


def test_token_budget_caps_every_step_and_chunks_long_prompts() -> None:
    d = Driver.make(num_blocks=64, max_num_batched_tokens=8)
    seq = d.add(list(range(20)), max_tokens=3)
    first = d.step()
    assert first.num_batched_tokens == 8
    assert [(s.start, s.num_new_tokens) for s in first.scheduled] == [(0, 8)]
    assert not first.scheduled[0].samples
    d.run()
    assert all(s.num_batched_tokens <= 8 for s in d.steps)
    # 20 prompt tokens in chunks 8, 8, 4 (sampling on the last), then 2 decode steps.
    assert [s.scheduled[0].num_new_tokens for s in d.steps] == [8, 8, 4, 1, 1]
    assert seq.output_token_ids == expected_output(list(range(20)), 3)
    assert seq.finish_reason == "length"


def test_prefill_chunk_size_is_separate_from_budget() -> None:
    d = Driver.make(num_blocks=64, max_num_batched_tokens=100, prefill_chunk_size=6)
    d.add(list(range(14)), max_tokens=1)
    d.run()
    assert [s.scheduled[0].num_new_tokens for s in d.steps] == [6, 6, 2]


def test_decodes_and_prefill_share_one_step() -> None:
    d = Driver.make(num_blocks=64, max_num_batched_tokens=10)
    a = d.add([1, 2, 3], max_tokens=5)
    d.step()  # a's prefill
    b = d.add(list(range(30)), max_tokens=2)
    out = d.step()
    assert [(s.seq.seq_id, s.num_new_tokens) for s in out.scheduled] == [
        (a.seq_id, 1),
        (b.seq_id, 9),
    ]
    d.run()
    assert a.output_token_ids == expected_output([1, 2, 3], 5)
    assert b.output_token_ids == expected_output(list(range(30)), 2)


def test_max_num_seqs_limits_running() -> None:
    d = Driver.make(num_blocks=64, max_num_seqs=2)
    for i in range(5):
        d.add([i + 1] * 3, max_tokens=4)
    d.run()
    assert max(len(s.scheduled) for s in d.steps) == 2
    assert all(s.finish_reason == "length" for s in d.seqs)


def test_admission_waits_for_kv_blocks() -> None:
    # 4 blocks of 4 tokens: a 10-token prompt needs 3 blocks, so the second waits.
    d = Driver.make(num_blocks=4)
    d.add(list(range(10)), max_tokens=2)
    d.add(list(range(10)), max_tokens=2)
    first = d.step()
    assert len(first.scheduled) == 1
    d.run()
    assert all(s.finish_reason == "length" for s in d.seqs)
    d.scheduler.kv.check_integrity()
    assert d.scheduler.kv.pool.num_free == 4


def test_preemption_by_recompute_gives_identical_outputs() -> None:
    prompts = [list(range(i, i + 7)) for i in range(6)]
    roomy = Driver.make(num_blocks=100)
    tight = Driver.make(num_blocks=12)
    for p in prompts:
        roomy.add(list(p), max_tokens=16)
        tight.add(list(p), max_tokens=16)
    roomy.run()
    tight.run()
    assert roomy.scheduler.num_preemptions == 0
    assert tight.scheduler.num_preemptions > 0
    assert sum(s.num_preemptions for s in tight.seqs) == tight.scheduler.num_preemptions
    for a, b in zip(roomy.seqs, tight.seqs, strict=True):
        assert a.output_token_ids == b.output_token_ids == expected_output(a.prompt_token_ids, 16)
    tight.scheduler.kv.check_integrity()
    assert tight.scheduler.kv.pool.num_free == 12


def test_finish_frees_blocks_of_waiting_and_running() -> None:
    d = Driver.make(num_blocks=8)
    a = d.add(list(range(8)), max_tokens=50)
    b = d.add(list(range(8)), max_tokens=50)
    d.step()
    d.scheduler.finish(a, "abort")
    d.scheduler.finish(b, "abort")
    assert not d.scheduler.has_unfinished()
    assert d.scheduler.kv.pool.num_free == 8
    d.scheduler.kv.check_integrity()
