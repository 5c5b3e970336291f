"""The least any init written in Python does, for bench_keeper.py to set beside tini and the keeper.

    python bench/python_floor.py COMMAND [ARGS...]

It starts the command in its own process group, passes SIGTERM and SIGINT to
that group, reaps the command and exits with its code: no arguments parsed,
no files written, no imports past os, select and signal. What it costs over
tini is what the interpreter costs (its start, its wake-up on a signal, the
exit of a process its size); what the keeper costs over it is the keeper's own.
"""
import os
import select
import signal
import sys

wake_r, wake_w = os.pipe()
os.set_blocking(wake_w, False)
signal.set_wakeup_fd(wake_w)
for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
    signal.signal(signum, lambda *_: None)
pid = os.posix_spawnp(sys.argv[1], sys.argv[1:], os.environ, setpgroup=0)
while True:
    select.select([wake_r], [], [])
    for signum in os.read(wake_r, 64):
        if signum == signal.SIGCHLD:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                os._exit(os.waitstatus_to_exitcode(status))
        else:
            os.killpg(pid, signum)
