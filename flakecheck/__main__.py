"""`python -m flakecheck ...`: the same command line as `flakecheck ...` (the package pins first)."""

from flakecheck.cli import main

main()
