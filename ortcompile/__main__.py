from ortcompile.cli import run

if __name__ == "__main__":  # guarded: batch children are spawned and import the main module
    run()
