"""Counterexamples out of a Hypothesis failure, for reports (`pagedkv check`, JSON, JUnit)."""


def counterexamples(error: BaseException) -> list:
    """Every distinct failure in `error`, with the program that shows it: [{"error", "program"}].
    Hypothesis attaches the shrunk program to each failure as notes ("Falsifying example:",
    "state = ...", ...) and wraps several distinct failures in an exception group."""
    inner = getattr(error, "exceptions", None)
    if isinstance(inner, (list, tuple)):
        return [found for sub in inner for found in counterexamples(sub)]
    # Hypothesis adds "You can reproduce this example by ... @reproduce_failure(...)" where print_blob
    # is on (its default when CI is set): advice for its own decorator, not part of the program.
    notes = [note for note in getattr(error, "__notes__", ())
             if isinstance(note, str) and not note.strip().startswith("You can reproduce this example")]
    return [{"error": f"{type(error).__name__}: {error}", "program": "\n".join(notes).strip()}]
