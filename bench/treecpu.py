#!/usr/bin/env python3
"""Wall and CPU (user + system) of a command's whole process tree, orphans included.

    python bench/treecpu.py -- python -m ortcompile compile a.onnx b.onnx -o out --ep qnn -q

`/usr/bin/time` counts only the descendants that were waited for: a child its parent leaves behind at exit (the
worker zygote of a batch or a test run, killed by its death signal when its parent exits, and the forks it reaped)
is reaped by init and missing from the figure. Here this process is the tree's subreaper (PR_SET_CHILD_SUBREAPER):
every orphan is re-parented to it and reaped here, so its CPU (and that of the children it reaped) is counted.
Prints one line to stderr: `treecpu: wall W s, cpu C s (user U, sys S), exit code N`; exits with the command's code.
"""

from __future__ import annotations

import ctypes
import os
import resource
import subprocess
import sys
import time

_PR_SET_CHILD_SUBREAPER = 36


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        sys.exit(__doc__)
    ctypes.CDLL(None).prctl(_PR_SET_CHILD_SUBREAPER, 1)
    start = time.perf_counter()
    code = subprocess.call(argv)
    while True:  # the orphans: wait until the last one has ended
        try:
            os.wait()
        except ChildProcessError:
            break
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"treecpu: wall {wall:.2f} s, cpu {usage.ru_utime + usage.ru_stime:.2f} s (user {usage.ru_utime:.2f}, "
          f"sys {usage.ru_stime:.2f}), exit code {code}", file=sys.stderr)
    sys.exit(code)


if __name__ == "__main__":
    main()
