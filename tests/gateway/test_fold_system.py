"""Templates without a system role get the system text folded into the first turn."""

from __future__ import annotations

from gateway.tokenize import fold_system_messages


def test_leading_system_and_developer_messages_join_the_first_user_turn() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": "Use French."},
        {"role": "user", "content": "Hi", "name": "ann"},
        {"role": "assistant", "content": "Salut"},
    ]
    assert fold_system_messages(messages) == [
        {"role": "user", "content": "Be brief.\n\nUse French.\n\nHi", "name": "ann"},
        {"role": "assistant", "content": "Salut"},
    ]


def test_nothing_to_fold_or_nowhere_to_fold_it() -> None:
    assert fold_system_messages([{"role": "user", "content": "Hi"}]) is None
    assert fold_system_messages([{"role": "system", "content": "x"}]) is None
    system_then_assistant = [
        {"role": "system", "content": "x"},
        {"role": "assistant", "content": "y"},
    ]
    assert fold_system_messages(system_then_assistant) is None
    parts = [{"role": "system", "content": "x"}, {"role": "user", "content": [{"type": "text"}]}]
    assert fold_system_messages(parts) is None
