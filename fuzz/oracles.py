"""The conformance oracles: each check the harness makes has a name, reported when it fires."""

#: name -> what it demands of a subject. Order is documentation order, not check order.
ORACLES = {
    "readback": "every live sequence reads back its own tokens, each after its own prefix, through its table",
    "block_range": "block ids are in range and no id repeats within one table",
    "free_count": "num_free_blocks() == num_blocks - |union of live tables| (evictable cached blocks count as free)",
    "oom_exact": "OutOfBlocks is raised exactly when the blocks the operation needs are not available "
                 "(policy any: judged against the subject's own free blocks and cache)",
    "atomic_failure": "an operation that raised changed nothing observable (tables, free count)",
    "id_errors": "unknown ids raise UnknownSequence, duplicate ids raise DuplicateSequence, and only then "
                 "(policy spec: in the spec's order; policy any: any one of the errors that apply)",
    "state_errors": "InvalidState is raised exactly when the sequence's status forbids the operation",
    "cache_hit": "add() reports as many cached prompt tokens as the spec serves (policy spec); under policy any, "
                 "whole blocks below the whole prompt that hold exactly the prompt's content",
    "completeness": "with complete_cache (policy any): a prompt block whose newest holder was not handed out "
                    "again since is served from the cache",
    "cow_exact": "append() returns one copy exactly when it writes into a shared, partly filled tail",
    "swap_exact": "a swap copies into blocks no other sequence of that pool holds; with swap_sharing, a full "
                  "block may land on one already holding exactly its content",
    "table_shape": "a running sequence of n tokens holds ceil(n / block_size) blocks",
    "kv_events": "with kv_events: the index replayed from the subject's events equals its own index after every "
                 "step; stores chain from announced parents, one prefix per key; removals name counted keys",
    "index_content": "with kv_events: every index entry names a block holding its key's announced prefix, and "
                     "no block is named by a full-block key and a partial one at once",
    "batch_tables": "with batch_tables: block_tables(batch) of running sequences, in any order, is each one's own "
                    "block_table padded with -1 to the batch's widest, however often batches were read before",
    "crash": "the subject raises nothing but pagedkv errors",
    "protocol": "each method returns what the protocol says (add an int, append a list of (src, dst) pairs, ...)",
    "timeout": "every call returns within the call timeout (pagedkv fuzz --call-timeout)",
}


class OracleFailure(AssertionError):
    """A named oracle fired. `report` holds the program so far and the state around the failure."""

    def __init__(self, oracle: str, message: str, report: dict):
        super().__init__(f"[{oracle}] {message}")
        self.oracle = oracle
        self.message = message
        self.report = report


_FAILURE_CLASSES = {}


def failure_class(oracle: str) -> type:
    """The OracleFailure subclass of one oracle. Hypothesis tells bugs apart by exception type and
    place; one class per oracle lets it report each distinct oracle's failure, not just the first."""
    if oracle not in _FAILURE_CLASSES:
        _FAILURE_CLASSES[oracle] = type(f"OracleFailure[{oracle}]", (OracleFailure,), {"__module__": __name__})
    return _FAILURE_CLASSES[oracle]
