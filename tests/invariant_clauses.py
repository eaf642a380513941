"""What the two invariant-clause tests share: naming the clause behind each problem message, and
counting the clauses an invariant function states (so a clause added or lost fails a table).

A *clause* is one message template of an invariant check, matched by a regular expression. A
planted corruption must make exactly its own clause fire (plus any companions the table names,
each with the reason it cannot be avoided), and no message may match two clauses. The valid states
the corruptions are planted into are drawn the same way for the spec and the allocator."""

import ast
import inspect
import re
import textwrap

from hypothesis import strategies as st

from pagedkv.spec import PagedKVError


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


# ---------------------------------------------------------------------- valid states

ANCHOR_BLOCKS = 12   # the most the anchors hold at once (see `anchored`)
ALPHABET = 4


def anchor_prompt(base: int, length: int) -> list:
    return list(range(base, base + length))


def anchored(subject, B: int):
    """Anchor sequences, so that every corruption finds a target (B >= 2), in a new subject:
    0 running, 2 full blocks and a 1-token tail only it holds; 1 swapped (2 CPU blocks); 2 waiting;
    3 freed, its 2 full blocks evictable; 4 and its fork 5, one table; 6 and 7, separate blocks
    filled with one content (one content, two holders)."""
    subject.add(0, anchor_prompt(100, 2 * B + 1))
    subject.add(1, anchor_prompt(200, B + 1))
    subject.swap_out(1)
    subject.add(2, anchor_prompt(300, 1))
    subject.preempt(2, "recompute")
    subject.add(3, anchor_prompt(400, 2 * B))
    subject.free(3)
    subject.add(4, anchor_prompt(500, B + 1))
    subject.fork(4, 5)
    for seq_id in (6, 7):
        subject.add(seq_id, anchor_prompt(600, B - 1))
        subject.append(seq_id, 699)
    return subject


def operations(B: int):
    """One operation of the random part; `pick` indexes the random part's own live ids. Prompts may
    start with anchor 0's full blocks, so cached blocks are shared."""
    pick = st.integers(0, 9)
    prompt = st.builds(lambda shared, own: anchor_prompt(100, shared * B) + own, st.integers(0, 2),
                       st.lists(st.integers(0, ALPHABET - 1), max_size=2 * B)).filter(bool)
    return st.one_of(
        st.tuples(st.just("add"), prompt),
        st.tuples(st.just("append"), pick, st.integers(0, ALPHABET - 1)),
        st.tuples(st.just("fork"), pick),
        st.tuples(st.just("free"), pick),
        st.tuples(st.just("preempt"), pick, st.sampled_from(["recompute", "swap"])),
        st.tuples(st.just("resume"), pick),
        st.tuples(st.just("step"), st.lists(pick, max_size=3)),
    )


def run_program(subject, program: list) -> None:
    """Apply the random part to sequences 10 and up, ignoring the operations the subject refuses."""
    own, fresh = [], iter(range(10, 10_000))
    for op, *args in program:
        try:
            if op == "add":
                seq_id = next(fresh)
                subject.add(seq_id, args[0])
                own.append(seq_id)
            elif op == "step":
                running = [s for s in own if subject.status(s) == "running"]
                subject.step({running[i % len(running)]: 1 for i in args[0]} if running else {})
            elif own:
                seq_id = own[args[0] % len(own)]
                if op == "fork":
                    child = next(fresh)
                    subject.fork(seq_id, child)
                    own.append(child)
                elif op == "free":
                    subject.free(seq_id)
                    own.remove(seq_id)
                else:
                    getattr(subject, op)(seq_id, *args[1:])
        except PagedKVError:
            pass


@st.composite
def valid_states(draw, constructors):
    """A subject (made by a constructor drawn from `constructors`, called with num_blocks,
    block_size and num_cpu_blocks, prefix caching on) with the anchors, then a random program.
    The pool has room for the program, so it (almost) never evicts or preempts an anchor."""
    make = draw(constructors, label="constructor")
    B = draw(st.integers(2, 4), label="block_size")
    program = draw(st.lists(operations(B), max_size=12), label="program")
    subject = anchored(make(ANCHOR_BLOCKS + 4 * len(program), B, 2 + draw(st.integers(0, 4), label="extra cpu")), B)
    run_program(subject, program)
    return subject
