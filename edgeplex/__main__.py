from edgeplex.cli import main

main()
