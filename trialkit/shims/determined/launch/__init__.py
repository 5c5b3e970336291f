"""`python3 -m determined.launch.NAME ...` runs trialkit's launcher of that name with the same arguments
(Determined's and trialkit's launchers share one grammar: docs/launchers.md)."""
import runpy
import sys


def run_as(module: str) -> None:
    """Run trialkit's `module` as the program, with this one's arguments; its exit is this process's."""
    sys.argv[0] = module
    runpy.run_module(module, run_name="__main__", alter_sys=True)
