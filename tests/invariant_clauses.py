"""What the two invariant-clause tests share: naming the clause behind each problem message, and
counting the clauses an invariant function states (so a clause added or lost fails a table).

A *clause* is one message template of an invariant check, matched by a regular expression. A
planted corruption must make exactly its own clause fire (plus any companions the table names,
each with the reason it cannot be avoided), and no message may match two clauses."""

import ast
import inspect
import re
import textwrap


def message_templates(function) -> int:
    """How many problem messages `function`'s source states: each f-string or string that is the
    argument of an `.append(...)` or the element of a list comprehension."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    found = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "append":
            found += sum(_is_text(arg) for arg in node.args)
        elif isinstance(node, ast.ListComp):
            found += _is_text(node.elt)
    return found


def _is_text(node) -> bool:
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str))


def clauses_fired(messages: list, patterns: dict) -> set:
    """The clauses (keys of `patterns`, each a regex) the messages come from; a message that
    matches no clause or two is an error of the table itself."""
    fired = set()
    for message in messages:
        matches = [clause for clause, pattern in patterns.items() if re.fullmatch(pattern, message)]
        assert len(matches) == 1, f"message {message!r} matches clauses {matches}, want exactly one"
        fired.add(matches[0])
    return fired
