from ortcompile.cli import main

main()
