"""Finds the rules of a Lark grammar that can never finish (no finite derivation).

`start: "a" start` compiles, and then every mask of a request under it is a mask of
an unending output: it never completes, and its parser's work grows with each token
until llguidance's limits end it. Such a rule is found before anything is compiled,
by the textbook "productive symbols" fixpoint: a rule is productive when one of its
alternatives holds only productive items; terminals, literals, regexes, special
tokens and embedded `%json`/`%regex` count as productive (their own emptiness is
llguidance's to find, when the first mask is computed).

The reading is conservative: only llguidance's Lark dialect as far as this module
knows it is analysed; anything else (templates, an unknown directive, text that does
not parse) gives no opinion, never a refusal.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass

# One token of the grammar text; `kind` is the name of the pattern that matched.
_TOKEN = re.compile(
    r"""
    (?P<space>[ \t\r\f]+|\\\n)
  | (?P<newline>\n)
  | (?P<comment>//[^\n]*|\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"i?)
  | (?P<regex>/(?![/*])(?:[^/\\\n]|\\.)+/[imslux]*)
  | (?P<special><[^<>\n]*>)
  | (?P<directive>%[A-Za-z_]+)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<ref>@[A-Za-z_][A-Za-z0-9_]*)
  | (?P<number>\d+)
  | (?P<range>\.\.)
  | (?P<punct>[:|()\[\]?*+~.,=&!])
    """,
    re.VERBOSE,
)
# Directives that embed a JSON value in a rule body (an atom).
_EMBEDDED = frozenset({"%json", "%regex"})
_JSON = json.JSONDecoder()


class _Unknown(Exception):
    """The text is outside what this module reads: no opinion."""


@dataclass(frozen=True)
class _Tok:
    kind: str
    text: str
    line_start: bool


def never_finishing_rules(grammar: str) -> list[str] | None:
    """The rules reachable from `start` that have no finite derivation, in order of
    definition (`start` first when it is one); None when the grammar is not read.

    Linear in the grammar's size: the rules are an and/or graph (a sequence needs all
    its items, alternatives need one) evaluated by counting, not by repeated passes.
    """
    try:
        rules = _rules(_tokens(grammar))
        if "start" not in rules:
            return None
        graph = _Graph(rules)
        for name, bodies in rules.items():
            for body in bodies:
                graph.define(name, _Parser(body, graph).expression())
    except (_Unknown, RecursionError):
        return None
    productive = graph.solve()
    reachable = _reachable("start", rules)
    stuck = [name for name in rules if name in reachable and name not in productive]
    return sorted(stuck, key=lambda n: n != "start")


def _tokens(text: str) -> list[_Tok]:
    out: list[_Tok] = []
    pos, line_start = 0, True
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise _Unknown(pos)
        kind = m.lastgroup or ""
        pos = m.end()
        if kind == "newline":
            line_start = True
            continue
        if kind in ("space", "comment"):
            continue
        out.append(_Tok(kind, m.group(), line_start))
        line_start = False
        if kind == "directive" and (m.group() in _EMBEDDED or m.group() == "%llguidance"):
            # A JSON value follows (it may hold anything, newlines included).
            while pos < len(text) and text[pos] in " \t\r\n":
                pos += 1
            try:
                _, pos = _JSON.raw_decode(text, pos)
            except ValueError:
                raise _Unknown(pos) from None
            out.append(_Tok("json", "", False))
    return out


def _rules(tokens: list[_Tok]) -> dict[str, list[list[_Tok]]]:
    """Each lowercase rule's body tokens (several for a rule extended again)."""
    rules: dict[str, list[list[_Tok]]] = {}
    current: list[_Tok] | None = None
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.line_start:
            header = _header(tokens, i)
            if header is not None:
                name, i = header
                # Terminals (UPPERCASE) are regular: counted productive, not analysed.
                current = [] if name.lstrip("_")[:1].islower() else None
                if current is not None:
                    rules.setdefault(name, []).append(current)
                continue
            if tok.kind == "directive" and tok.text not in _EMBEDDED:
                if tok.text not in ("%ignore", "%import", "%llguidance"):
                    raise _Unknown(tok.text)
                current = None
                i += 1
                continue
        if current is not None:
            current.append(tok)
        i += 1
    return rules


def _header(tokens: list[_Tok], i: int) -> tuple[str, int] | None:
    """`[?!]name([attrs])?(.N)?:` at `i`: the name and the index after the colon."""
    j = i
    if tokens[j].text in ("?", "!"):
        j += 1
    if j >= len(tokens) or tokens[j].kind != "name":
        return None
    name = tokens[j].text
    j += 1
    if j < len(tokens) and tokens[j].text == "[":
        depth = 0
        while j < len(tokens):
            depth += {"[": 1, "]": -1}.get(tokens[j].text, 0)
            j += 1
            if depth == 0:
                break
    if j + 1 < len(tokens) and tokens[j].text == "." and tokens[j + 1].kind == "number":
        j += 2
    if j < len(tokens) and tokens[j].text == ":":
        return name, j + 1
    return None


# -- the expression: alternatives of items ------------------------------------------

_TRUE = -1  # a node that derives finite text whatever the rules (a literal, `x?`)


class _Graph:
    """An and/or graph: node i is true once `need[i]` of its children are (an "and"
    needs all of them, an "or" one); each rule is an "or" of its definitions."""

    def __init__(self, rules: Collection[str]) -> None:
        self.need: list[int] = []
        self.parents: list[list[int]] = []
        self.rule = {name: self._node(1) for name in rules}
        self.true_rules: list[str] = []

    def _node(self, need: int) -> int:
        self.need.append(need)
        self.parents.append([])
        return len(self.need) - 1

    def node(self, all_of: bool, children: list[int]) -> int:
        """A sequence (`all_of`) or a choice of `children`."""
        if all_of:
            children = [c for c in children if c != _TRUE]
            if not children:
                return _TRUE
        elif _TRUE in children:
            return _TRUE
        if len(children) == 1:
            return children[0]
        node = self._node(len(children) if all_of else 1)
        for child in children:
            self.parents[child].append(node)
        return node

    def define(self, name: str, body: int) -> None:
        if body == _TRUE:
            self.true_rules.append(name)
        else:
            self.parents[body].append(self.rule[name])

    def solve(self) -> set[str]:
        """The productive rules."""
        done = [False] * len(self.need)
        todo = [self.rule[name] for name in self.true_rules]
        for node in todo:
            done[node] = True
        while todo:
            for parent in self.parents[todo.pop()]:
                self.need[parent] -= 1
                if self.need[parent] <= 0 and not done[parent]:
                    done[parent] = True
                    todo.append(parent)
        return {name for name, node in self.rule.items() if done[node]}


class _Parser:
    """Reads one rule body into the graph: alternatives of sequences of items."""

    def __init__(self, toks: list[_Tok], graph: _Graph) -> None:
        self.toks, self.graph, self.i = toks, graph, 0

    def expression(self) -> int:
        result = self._alternatives()
        if self.i != len(self.toks):
            raise _Unknown(self.toks[self.i].text)
        return result

    def _peek(self) -> str | None:
        return self.toks[self.i].text if self.i < len(self.toks) else None

    def _alternatives(self) -> int:
        options = [self._sequence()]
        while self._peek() == "|":
            self.i += 1
            options.append(self._sequence())
        return self.graph.node(False, options)

    def _sequence(self) -> int:
        items: list[int] = []
        while self._peek() not in (None, "|", ")", "]"):
            items.append(self._item())
        return self.graph.node(True, items)

    def _item(self) -> int:
        atom = self._atom()
        nxt = self._peek()
        if nxt in ("?", "*"):
            self.i += 1
            return _TRUE
        if nxt == "+":
            self.i += 1
        elif nxt == "~":
            self.i += 1
            low = self._number()
            if self._peek() == "..":
                self.i += 1
                self._number()
            return _TRUE if low == 0 else atom
        return atom

    def _number(self) -> int:
        tok = self.toks[self.i] if self.i < len(self.toks) else None
        if tok is None or tok.kind != "number":
            raise _Unknown("a number")
        self.i += 1
        return int(tok.text)

    def _atom(self) -> int:
        if self.i >= len(self.toks):
            raise _Unknown("end")
        tok = self.toks[self.i]
        self.i += 1
        if tok.text in ("(", "["):
            inner = self._alternatives()
            close = ")" if tok.text == "(" else "]"
            if self._peek() != close:
                raise _Unknown(close)
            self.i += 1
            return _TRUE if close == "]" else inner
        if tok.kind == "string":
            if self._peek() == "..":
                self.i += 2
            return _TRUE
        if tok.kind in ("regex", "special", "ref", "json"):
            return _TRUE
        if tok.kind == "directive" and tok.text in _EMBEDDED:
            self.i += 1  # its JSON value
            return _TRUE
        if tok.kind == "name":
            return self.graph.rule.get(tok.text, _TRUE)  # a terminal: regular, productive
        raise _Unknown(tok.text)


def _reachable(start: str, rules: dict[str, list[list[_Tok]]]) -> set[str]:
    seen = {start}
    todo = [start]
    while todo:
        for body in rules[todo.pop()]:
            for tok in body:
                if tok.kind == "name" and tok.text in rules and tok.text not in seen:
                    seen.add(tok.text)
                    todo.append(tok.text)
    return seen
