from ortcompile.cli import run

run()
