"""A small parser and evaluator for DynamoDB condition, update and projection expressions.

It covers what pynamodb generates (and a little more): conditions with
``= <> < <= > >=``, ``BETWEEN``, ``IN (..)``, ``AND``/``OR``/``NOT``, parentheses,
``attribute_exists``, ``attribute_not_exists``, ``attribute_type``, ``begins_with``,
``contains`` and ``size``; updates with ``SET`` (``a = b``, ``a = b + c``,
``a = b - c``, ``if_not_exists``, ``list_append``), ``REMOVE``, ``ADD`` and
``DELETE``, several clauses in one expression; projections (top-level names).

Items are DynamoDB JSON (``{"S": "x"}``, ``{"N": "1"}``, ...). Placeholders
(``#n``, ``:v``) are checked the way DynamoDB checks them: an undefined one, or one
defined but unused by any expression of the request, is a ``ValidationException``.
Parsed expressions are cached by their text.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Context, Decimal, InvalidOperation
from typing import Any, TypeAlias

Item: TypeAlias = dict[str, Any]
AttrValue: TypeAlias = Mapping[str, Any]
PathElem: TypeAlias = str | int
_CTX = Context(prec=38)


class ExpressionError(Exception):
    """The request is invalid (DynamoDB answers ``ValidationException``)."""


# --------------------------------------------------------------------------- tokens

_TOKEN = re.compile(
    r"\s*(?:(?P<name>#[A-Za-z0-9_]+)|(?P<value>:[A-Za-z0-9_]+)"
    r"|(?P<op><>|<=|>=|=|<|>|\(|\)|,|\+|-|\.|\[|\])"
    r"|(?P<word>[A-Za-z_][A-Za-z0-9_]*)|(?P<int>\d+))"
)
_KEYWORDS = frozenset({"AND", "OR", "NOT", "IN", "BETWEEN", "SET", "REMOVE", "ADD", "DELETE"})


@dataclass(frozen=True)
class Tok:
    kind: str  # name | value | op | word | int | end
    text: str


def tokenize(text: str) -> list[Tok]:
    out: list[Tok] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise ExpressionError(f"Invalid expression: syntax error near {text[pos : pos + 20]!r}")
        kind = m.lastgroup or ""
        out.append(Tok(kind, m.group(kind)))
        pos = m.end()
    out.append(Tok("end", ""))
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = tokenize(text)
        self.i = 0
        self.names: set[str] = set()
        self.values: set[str] = set()

    def peek(self) -> Tok:
        return self.toks[self.i]

    def next(self) -> Tok:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def is_word(self, word: str) -> bool:
        tok = self.peek()
        return tok.kind == "word" and tok.text.upper() == word

    def accept_op(self, op: str) -> bool:
        tok = self.peek()
        if tok.kind == "op" and tok.text == op:
            self.i += 1
            return True
        return False

    def expect_op(self, op: str) -> None:
        if not self.accept_op(op):
            raise self.error(f"expected {op!r}")

    def error(self, what: str) -> ExpressionError:
        tok = self.peek()
        return ExpressionError(
            f"Invalid expression: {what}, near token {tok.text or '<end>'!r} in {self.text!r}"
        )

    def done(self) -> None:
        if self.peek().kind != "end":
            raise self.error("unexpected trailing input")

    # paths and operands ------------------------------------------------------

    def path(self) -> tuple[PathElem, ...]:
        elems: list[PathElem] = [self._path_name()]
        while True:
            if self.accept_op("."):
                elems.append(self._path_name())
            elif self.accept_op("["):
                tok = self.next()
                if tok.kind != "int":
                    raise self.error("expected a list index")
                elems.append(int(tok.text))
                self.expect_op("]")
            else:
                return tuple(elems)

    def _path_name(self) -> str:
        tok = self.next()
        if tok.kind == "name":
            self.names.add(tok.text)
            return tok.text
        if tok.kind == "word" and tok.text.upper() not in _KEYWORDS:
            return "=" + tok.text  # a literal attribute name (no placeholder)
        raise ExpressionError(
            f"Invalid expression: expected an attribute name, got {tok.text!r} in {self.text!r}"
        )

    def value_ref(self) -> str:
        tok = self.next()
        if tok.kind != "value":
            raise ExpressionError(
                f"Invalid expression: expected a value placeholder, got {tok.text!r}"
            )
        self.values.add(tok.text)
        return tok.text


# --------------------------------------------------------------------------- values


def num(av: AttrValue) -> Decimal:
    try:
        return Decimal(str(av["N"]))
    except (KeyError, InvalidOperation):
        raise ExpressionError(f"not a number: {av!r}") from None


def norm_number(d: Decimal) -> str:
    """DynamoDB's canonical spelling of a number (no exponent, no trailing zeros)."""
    d = _CTX.plus(d)
    if d == 0:
        return "0"
    text = format(d.normalize(_CTX), "f")
    return text


def stored(av: AttrValue) -> dict[str, Any]:
    """An attribute value as DynamoDB stores it: numbers in canonical form."""
    t = next(iter(av))
    v = av[t]
    if t == "N":
        return {"N": norm_number(Decimal(str(v)))}
    if t == "NS":
        return {"NS": [norm_number(Decimal(str(x))) for x in v]}
    if t == "M":
        return {"M": {k: stored(x) for k, x in v.items()}}
    if t == "L":
        return {"L": [stored(x) for x in v]}
    return {t: v}


def attr_type(av: AttrValue) -> str:
    return next(iter(av))


def _canon(av: AttrValue) -> Any:
    t = attr_type(av)
    v = av[t]
    if t == "N":
        return ("N", Decimal(str(v)))
    if t in ("SS", "BS"):
        return (t, frozenset(v))
    if t == "NS":
        return (t, frozenset(Decimal(str(x)) for x in v))
    if t == "L":
        return ("L", tuple(_canon(x) for x in v))
    if t == "M":
        return ("M", tuple(sorted((k, _canon(x)) for k, x in v.items())))
    if t == "NULL":
        return ("NULL", True)
    return (t, v)


def equal(a: AttrValue | None, b: AttrValue | None) -> bool:
    if a is None or b is None:
        return False
    return bool(_canon(a) == _canon(b))


def _ordered(a: AttrValue | None, b: AttrValue | None) -> tuple[Any, Any] | None:
    if a is None or b is None:
        return None
    ta, tb = attr_type(a), attr_type(b)
    if ta != tb or ta not in ("N", "S", "B"):
        return None
    if ta == "N":
        return num(a), num(b)
    return a[ta], b[tb]


def get_path(item: Mapping[str, Any] | None, path: Sequence[PathElem]) -> AttrValue | None:
    if item is None:
        return None
    cur: Any = item.get(str(path[0]))
    for elem in path[1:]:
        if cur is None:
            return None
        if isinstance(elem, int):
            if "L" not in cur or elem >= len(cur["L"]):
                return None
            cur = cur["L"][elem]
        else:
            if "M" not in cur:
                return None
            cur = cur["M"].get(elem)
    result: AttrValue | None = cur
    return result


def _set_path(item: Item, path: Sequence[PathElem], value: AttrValue) -> None:
    if len(path) == 1:
        item[str(path[0])] = stored(value)
        return
    parent = get_path(item, path[:-1])
    last = path[-1]
    if parent is None:
        raise ExpressionError(
            "The document path provided in the update expression is invalid for update"
        )
    if isinstance(last, int):
        if "L" not in parent:
            raise ExpressionError("The document path provided is invalid for update")
        lst = parent["L"]
        if last >= len(lst):
            lst.append(stored(value))
        else:
            lst[last] = stored(value)
    else:
        if "M" not in parent:
            raise ExpressionError("The document path provided is invalid for update")
        parent["M"][last] = stored(value)


def _remove_path(item: Item, path: Sequence[PathElem]) -> None:
    if len(path) == 1:
        item.pop(str(path[0]), None)
        return
    parent = get_path(item, path[:-1])
    last = path[-1]
    if parent is None:
        return
    if isinstance(last, int):
        if "L" in parent and last < len(parent["L"]):
            del parent["L"][last]
    elif "M" in parent:
        parent["M"].pop(last, None)


# --------------------------------------------------------------------------- compiled forms

Resolve: TypeAlias = Callable[[str], str]  # placeholder name -> attribute name
Operand: TypeAlias = Callable[[Mapping[str, Any] | None, Mapping[str, Any]], AttrValue | None]
Predicate: TypeAlias = Callable[[Mapping[str, Any] | None, Mapping[str, Any]], bool]


def _resolve_path(path: Sequence[PathElem], names: Mapping[str, str]) -> tuple[PathElem, ...]:
    out: list[PathElem] = []
    for elem in path:
        if isinstance(elem, int):
            out.append(elem)
        elif elem.startswith("="):
            out.append(elem[1:])
        else:
            if elem not in names:
                raise ExpressionError(
                    f"An expression attribute name used in the document path is not defined; "
                    f"attribute name: {elem}"
                )
            out.append(names[elem])
    return tuple(out)


def _value(ref: str, values: Mapping[str, Any]) -> AttrValue:
    try:
        v: AttrValue = values[ref]
    except KeyError:
        raise ExpressionError(
            f"An expression attribute value used in expression is not defined; "
            f"attribute value: {ref}"
        ) from None
    return v


@dataclass(frozen=True)
class ParsedCondition:
    ast: Any
    names: frozenset[str]
    values: frozenset[str]


@dataclass(frozen=True)
class ParsedUpdate:
    actions: tuple[tuple[str, Any, Any], ...]  # (kind, path, operand-ast)
    names: frozenset[str]
    values: frozenset[str]


@dataclass(frozen=True)
class ParsedProjection:
    paths: tuple[tuple[PathElem, ...], ...]
    names: frozenset[str]


# AST nodes are tuples: ("path", path) ("value", ref) ("size", path) ("cmp", op, a, b)
# ("between", a, lo, hi) ("in", a, [b...]) ("and", l, r) ("or", l, r) ("not", c)
# ("fn", name, args...) ("ifne", path, operand) ("append", a, b) ("arith", op, a, b)


class _ConditionParser(_Parser):
    def condition(self) -> Any:
        left = self.conj()
        while self.is_word("OR"):
            self.next()
            left = ("or", left, self.conj())
        return left

    def conj(self) -> Any:
        left = self.neg()
        while self.is_word("AND"):
            self.next()
            left = ("and", left, self.neg())
        return left

    def neg(self) -> Any:
        if self.is_word("NOT"):
            self.next()
            return ("not", self.neg())
        return self.primary()

    def primary(self) -> Any:
        if self.accept_op("("):
            inner = self.condition()
            self.expect_op(")")
            return inner
        tok = self.peek()
        if tok.kind == "word":
            fn = tok.text.lower()
            if fn in ("attribute_exists", "attribute_not_exists"):
                self.next()
                self.expect_op("(")
                path = self.path()
                self.expect_op(")")
                return ("fn", fn, path)
            if fn in ("attribute_type", "begins_with", "contains"):
                self.next()
                self.expect_op("(")
                path = self.path()
                self.expect_op(",")
                arg = self.operand()
                self.expect_op(")")
                return ("fn", fn, path, arg)
        left = self.operand()
        tok = self.peek()
        if tok.kind == "op" and tok.text in ("=", "<>", "<", "<=", ">", ">="):
            self.next()
            return ("cmp", tok.text, left, self.operand())
        if self.is_word("BETWEEN"):
            self.next()
            lo = self.operand()
            if not self.is_word("AND"):
                raise self.error("expected AND in BETWEEN")
            self.next()
            return ("between", left, lo, self.operand())
        if self.is_word("IN"):
            self.next()
            self.expect_op("(")
            options = [self.operand()]
            while self.accept_op(","):
                options.append(self.operand())
            self.expect_op(")")
            if len(options) > 100:
                raise ExpressionError("Invalid expression: too many IN operands")
            return ("in", left, tuple(options))
        raise self.error("expected a comparison")

    def operand(self) -> Any:
        tok = self.peek()
        if tok.kind == "value":
            return ("value", self.value_ref())
        if tok.kind == "word" and tok.text.lower() == "size":
            self.next()
            self.expect_op("(")
            path = self.path()
            self.expect_op(")")
            return ("size", path)
        return ("path", self.path())


def _eval_operand(node: Any, item: Mapping[str, Any] | None, ctx: _Ctx) -> AttrValue | None:
    kind = node[0]
    if kind == "value":
        return _value(node[1], ctx.values)
    if kind == "path":
        return get_path(item, _resolve_path(node[1], ctx.names))
    if kind == "size":
        av = get_path(item, _resolve_path(node[1], ctx.names))
        if av is None:
            return None
        t = attr_type(av)
        v = av[t]
        if t in ("S", "B", "SS", "NS", "BS", "L", "M"):
            return {"N": str(len(v) if t != "S" else len(str(v).encode()))}
        raise ExpressionError(f"Invalid operand type for size: {t}")
    raise ExpressionError(f"bad operand {node!r}")  # pragma: no cover


@dataclass(frozen=True)
class _Ctx:
    names: Mapping[str, str]
    values: Mapping[str, Any]


def _eval_cond(node: Any, item: Mapping[str, Any] | None, ctx: _Ctx) -> bool:
    kind = node[0]
    if kind == "and":
        return _eval_cond(node[1], item, ctx) and _eval_cond(node[2], item, ctx)
    if kind == "or":
        return _eval_cond(node[1], item, ctx) or _eval_cond(node[2], item, ctx)
    if kind == "not":
        return not _eval_cond(node[1], item, ctx)
    if kind == "cmp":
        op = node[1]
        a = _eval_operand(node[2], item, ctx)
        b = _eval_operand(node[3], item, ctx)
        if op == "=":
            return equal(a, b)
        if op == "<>":
            return not equal(a, b)
        pair = _ordered(a, b)
        if pair is None:
            return False
        x, y = pair
        if op == "<":
            return bool(x < y)
        if op == "<=":
            return bool(x <= y)
        if op == ">":
            return bool(x > y)
        return bool(x >= y)
    if kind == "between":
        a = _eval_operand(node[1], item, ctx)
        lo = _ordered(a, _eval_operand(node[2], item, ctx))
        hi = _ordered(a, _eval_operand(node[3], item, ctx))
        return lo is not None and hi is not None and lo[1] <= lo[0] and hi[0] <= hi[1]
    if kind == "in":
        a = _eval_operand(node[1], item, ctx)
        return any(equal(a, _eval_operand(opt, item, ctx)) for opt in node[2])
    if kind == "fn":
        fn = node[1]
        av = get_path(item, _resolve_path(node[2], ctx.names))
        if fn == "attribute_exists":
            return av is not None
        if fn == "attribute_not_exists":
            return av is None
        arg = _eval_operand(node[3], item, ctx)
        if av is None or arg is None:
            return False
        if fn == "attribute_type":
            return attr_type(av) == arg.get("S")
        if fn == "begins_with":
            t = attr_type(av)
            return t in ("S", "B") and attr_type(arg) == t and str(av[t]).startswith(str(arg[t]))
        # contains
        t = attr_type(av)
        if t == "S" and attr_type(arg) == "S":
            return str(arg["S"]) in str(av["S"])
        if t in ("SS", "NS", "BS"):
            return any(equal({t[0]: x}, arg) for x in av[t])
        if t == "L":
            return any(equal(x, arg) for x in av["L"])
        return False
    raise ExpressionError(f"bad condition node {node!r}")  # pragma: no cover


class _UpdateParser(_ConditionParser):
    def update(self) -> tuple[tuple[str, Any, Any], ...]:
        actions: list[tuple[str, Any, Any]] = []
        seen: set[str] = set()
        while self.peek().kind != "end":
            tok = self.next()
            clause = tok.text.upper() if tok.kind == "word" else ""
            if clause not in ("SET", "REMOVE", "ADD", "DELETE"):
                raise ExpressionError(
                    f"Invalid UpdateExpression: syntax error near {tok.text!r} in {self.text!r}"
                )
            if clause in seen:
                raise ExpressionError(
                    f'Invalid UpdateExpression: The "{clause}" section can only be used once'
                )
            seen.add(clause)
            while True:
                path = self.path()
                if clause == "SET":
                    self.expect_op("=")
                    actions.append(("SET", path, self.set_value()))
                elif clause == "REMOVE":
                    actions.append(("REMOVE", path, None))
                else:
                    actions.append((clause, path, ("value", self.value_ref())))
                if not self.accept_op(","):
                    break
        if not actions:
            raise ExpressionError("Invalid UpdateExpression: empty")
        return tuple(actions)

    def set_value(self) -> Any:
        left = self.set_operand()
        tok = self.peek()
        if tok.kind == "op" and tok.text in ("+", "-"):
            self.next()
            return ("arith", tok.text, left, self.set_operand())
        return left

    def set_operand(self) -> Any:
        tok = self.peek()
        if tok.kind == "word" and tok.text.lower() == "if_not_exists":
            self.next()
            self.expect_op("(")
            path = self.path()
            self.expect_op(",")
            alt = self.set_operand()
            self.expect_op(")")
            return ("ifne", path, alt)
        if tok.kind == "word" and tok.text.lower() == "list_append":
            self.next()
            self.expect_op("(")
            a = self.set_operand()
            self.expect_op(",")
            b = self.set_operand()
            self.expect_op(")")
            return ("append", a, b)
        if tok.kind == "value":
            return ("value", self.value_ref())
        return ("path", self.path())


def _eval_set(node: Any, item: Mapping[str, Any] | None, ctx: _Ctx) -> AttrValue:
    kind = node[0]
    if kind == "value":
        return _value(node[1], ctx.values)
    if kind == "path":
        av = get_path(item, _resolve_path(node[1], ctx.names))
        if av is None:
            raise ExpressionError(
                "The provided expression refers to an attribute that does not exist in the item"
            )
        return av
    if kind == "ifne":
        av = get_path(item, _resolve_path(node[1], ctx.names))
        return av if av is not None else _eval_set(node[2], item, ctx)
    if kind == "append":
        a, b = _eval_set(node[1], item, ctx), _eval_set(node[2], item, ctx)
        if "L" not in a or "L" not in b:
            raise ExpressionError("Incorrect operand type for operator or function: list_append")
        return {"L": [*a["L"], *b["L"]]}
    if kind == "arith":
        a, b = _eval_set(node[2], item, ctx), _eval_set(node[3], item, ctx)
        if "N" not in a or "N" not in b:
            raise ExpressionError(
                f"An operand in the update expression has an incorrect data type ({node[1]})"
            )
        res = num(a) + num(b) if node[1] == "+" else num(a) - num(b)
        return {"N": norm_number(res)}
    raise ExpressionError(f"bad update operand {node!r}")  # pragma: no cover


class _ProjectionParser(_Parser):
    def projection(self) -> tuple[tuple[PathElem, ...], ...]:
        paths = [self.path()]
        while self.accept_op(","):
            paths.append(self.path())
        return tuple(paths)


# --------------------------------------------------------------------------- public API

# A run parses the same few texts tens of thousands of times: each parse is kept.
_CACHE_LIMIT = 4096


@functools.lru_cache(maxsize=_CACHE_LIMIT)
def parse_condition(text: str) -> ParsedCondition:
    p = _ConditionParser(text)
    ast = p.condition()
    p.done()
    return ParsedCondition(ast, frozenset(p.names), frozenset(p.values))


@functools.lru_cache(maxsize=_CACHE_LIMIT)
def parse_update(text: str) -> ParsedUpdate:
    p = _UpdateParser(text)
    actions = p.update()
    p.done()
    return ParsedUpdate(actions, frozenset(p.names), frozenset(p.values))


@functools.lru_cache(maxsize=_CACHE_LIMIT)
def parse_projection(text: str) -> ParsedProjection:
    p = _ProjectionParser(text)
    paths = p.projection()
    p.done()
    return ParsedProjection(paths, frozenset(p.names))


@dataclass(frozen=True)
class Expressions:
    """The expressions of one request, parsed, with their placeholders checked."""

    condition: ParsedCondition | None
    update: ParsedUpdate | None
    projection: ParsedProjection | None
    names: Mapping[str, str]
    values: Mapping[str, Any]

    def check(self, item: Mapping[str, Any] | None) -> bool:
        if self.condition is None:
            return True
        return _eval_cond(self.condition.ast, item, _Ctx(self.names, self.values))

    def apply(self, item: Mapping[str, Any] | None, key: Mapping[str, Any]) -> Item:
        """The item after the update (a new dict); ``item`` is not changed."""
        new: Item = dict(item) if item is not None else {}
        for k, v in key.items():
            new.setdefault(k, dict(v))
        if self.update is None:
            return new
        ctx = _Ctx(self.names, self.values)
        old = item if item is not None else dict(key)
        touched: list[tuple[PathElem, ...]] = []
        planned: list[tuple[str, tuple[PathElem, ...], AttrValue | None]] = []
        for kind, raw_path, operand in self.update.actions:
            path = _resolve_path(raw_path, self.names)
            for other in touched:
                n = min(len(other), len(path))
                if other[:n] == path[:n]:
                    raise ExpressionError(
                        "Invalid UpdateExpression: Two document paths overlap with each other; "
                        f"must remove or rewrite one of these paths; path one: {list(other)}, "
                        f"path two: {list(path)}"
                    )
            touched.append(path)
            if path[0] in key:
                raise ExpressionError(
                    f"Cannot update attribute {path[0]}. This attribute is part of the key"
                )
            if kind == "SET":
                planned.append(("SET", path, _eval_set(operand, old, ctx)))
            elif kind == "REMOVE":
                planned.append(("REMOVE", path, None))
            else:
                planned.append((kind, path, _eval_operand(operand, old, ctx)))
        for kind, path, value in planned:
            top = str(path[0])
            if len(path) > 1 and top in new:
                new[top] = copy.deepcopy(new[top])  # copy on write: the old item stays intact
            if kind == "SET":
                assert value is not None
                _set_path(new, path, value)
            elif kind == "REMOVE":
                _remove_path(new, path)
            elif kind == "ADD":
                assert value is not None
                _set_path(new, path, _add(get_path(new, path), value))
            else:
                assert value is not None
                cur = get_path(new, path)
                if cur is not None:
                    left = _set_delete(cur, value)
                    if left is None:
                        _remove_path(new, path)
                    else:
                        _set_path(new, path, left)
        return new

    def project(self, item: Mapping[str, Any]) -> Item:
        if self.projection is None:
            return dict(item)
        out: Item = {}
        for raw in self.projection.paths:
            path = _resolve_path(raw, self.names)
            top = str(path[0])
            if top in item:
                out[top] = item[top]  # nested projections return the top attribute (enough here)
        return out


def _add(cur: AttrValue | None, value: AttrValue) -> AttrValue:
    t = attr_type(value)
    if t == "N":
        if cur is None:
            return {"N": norm_number(num(value))}
        if attr_type(cur) != "N":
            raise ExpressionError("An operand in the update expression has an incorrect data type")
        return {"N": norm_number(num(cur) + num(value))}
    if t in ("SS", "NS", "BS"):
        if cur is None:
            return {t: list(value[t])}
        if attr_type(cur) != t:
            raise ExpressionError("An operand in the update expression has an incorrect data type")
        merged = list(cur[t]) + [x for x in value[t] if x not in cur[t]]
        return {t: merged}
    raise ExpressionError(f"Incorrect operand type for operator or function; operator: ADD, {t}")


def _set_delete(cur: AttrValue, value: AttrValue) -> AttrValue | None:
    t = attr_type(value)
    if t not in ("SS", "NS", "BS") or attr_type(cur) != t:
        raise ExpressionError("Incorrect operand type for operator or function; operator: DELETE")
    left = [x for x in cur[t] if x not in value[t]]
    return {t: left} if left else None


def request_expressions(
    params: Mapping[str, Any],
    *,
    condition_key: str = "ConditionExpression",
    update_key: str = "UpdateExpression",
    projection_key: str = "ProjectionExpression",
) -> Expressions:
    """Parse a request's expressions and check its placeholders as DynamoDB does."""
    cond_text = params.get(condition_key)
    upd_text = params.get(update_key)
    proj_text = params.get(projection_key)
    names: Mapping[str, str] = params.get("ExpressionAttributeNames") or {}
    values: Mapping[str, Any] = params.get("ExpressionAttributeValues") or {}
    # Whether the placeholders check out depends only on the expressions' texts and
    # the placeholders' names, not on their values: a request of a shape already
    # checked skips the set arithmetic (each value's own form is still checked).
    shape = (cond_text, upd_text, proj_text, tuple(names), tuple(values))
    parsed = _CHECKED.get(shape)
    if parsed is None:
        parsed = _checked(cond_text, upd_text, proj_text, names, values)
        if len(_CHECKED) < _CACHE_LIMIT:
            _CHECKED[shape] = parsed
    for ref, av in values.items():
        if not isinstance(av, Mapping) or len(av) != 1:
            raise ExpressionError(f"ExpressionAttributeValues contains invalid value for {ref}")
    return Expressions(*parsed, names, values)


_Parsed: TypeAlias = tuple[
    "ParsedCondition | None", "ParsedUpdate | None", "ParsedProjection | None"
]
_CHECKED: dict[tuple[Any, ...], _Parsed] = {}


def _checked(
    cond_text: str | None,
    upd_text: str | None,
    proj_text: str | None,
    names: Mapping[str, str],
    values: Mapping[str, Any],
) -> _Parsed:
    """The request's expressions parsed, its placeholders checked (or ExpressionError)."""
    cond = parse_condition(cond_text) if cond_text else None
    upd = parse_update(upd_text) if upd_text else None
    proj = parse_projection(proj_text) if proj_text else None
    used_names: set[str] = set()
    used_values: set[str] = set()
    for part in (cond, upd):
        if part is not None:
            used_names |= part.names
            used_values |= part.values
    if proj is not None:
        used_names |= proj.names
    for n in sorted(used_names):
        if n not in names:
            raise ExpressionError(f"Value provided in ExpressionAttributeNames is not defined: {n}")
    for v in sorted(used_values):
        if v not in values:
            raise ExpressionError(
                f"An expression attribute value used in expression is not defined; "
                f"attribute value: {v}"
            )
    unused_n = sorted(set(names) - used_names)
    if unused_n:
        raise ExpressionError(
            "Value provided in ExpressionAttributeNames unused in expressions: "
            f"keys: {{{unused_n}}}"
        )
    unused_v = sorted(set(values) - used_values)
    if unused_v:
        raise ExpressionError(
            f"Value provided in ExpressionAttributeValues unused in expressions: keys: "
            f"{{{unused_v}}}"
        )
    return cond, upd, proj
