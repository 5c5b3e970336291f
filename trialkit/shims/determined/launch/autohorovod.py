"""`python3 -m determined.launch.autohorovod`: Determined's choice, made the same way: the horovod
launcher when the trial has more than one slot, else the training code alone, as trialkit's launchers
would run it for one worker (`--trial TRIAL` through run_trial, a .py script with this Python)."""
import os
import sys

from trialkit import env
from trialkit.errors import UserError, report_and_exit
from trialkit.launch import grammar

from . import run_as

PROG = "determined.launch.autohorovod"

if __name__ == "__main__":
    try:
        several = env.topology().world_size > 1
        if not several:
            command = grammar.worker_command(grammar.parse(sys.argv[1:], "horovod"), sys.executable)
    except UserError as err:
        report_and_exit(PROG, err)
    if several:
        run_as("trialkit.launch.horovod")
    else:
        os.execvp(command[0], command)
