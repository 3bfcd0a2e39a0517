"""`python -m edgeplex`: the `edgeplex` command (edgeplex.cli)."""

from edgeplex.cli import main

main()
