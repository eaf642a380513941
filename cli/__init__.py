"""The `pagedkv` command: thin wrappers that parse arguments, call the rooms and print."""
