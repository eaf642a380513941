"""`python -m pagedkv`: the same command as `pagedkv`."""
from pagedkv.cli.main import main

main(prog_name="pagedkv")
