"""Run a trial class in one worker: `python -m trialkit.launch.run_trial TRIAL`.

The launchers put it in every worker for `--trial TRIAL`. Its life: load the
class, build it with the trial's parameters (trialkit.get_next_parameter),
resume it from the checkpoint dir when it can load and a checkpoint is there,
run it, then either save it and exit 143 when a stop was asked (AdaptDL's
"checkpointed, reschedule me"), or report what run() returned as the final
result and exit 0.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional, Sequence

import trialkit  # the SDK: parameters in, the final result out
from trialkit import adaptdl
from trialkit import trial as trials
from trialkit.errors import UserError, report_and_exit

PROG = "trialkit.launch.run_trial"


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if len(argv) != 1:
            raise UserError(f"expected one TRIAL, got {len(argv)} arguments", fix=trials.FORMAT_HINT)
        cls = trials.load(argv[0])
    except UserError as err:
        report_and_exit(PROG, err)
    instance = cls(trialkit.get_next_parameter())
    checkpoint = Path(trialkit.checkpoint_dir())
    if trials.defines(cls, "load") and any(checkpoint.iterdir()):
        instance.load(checkpoint)
    if trials.defines(cls, "save"):
        trials.catch_stop_signals()  # a trial that can save gets to save instead of dying
    result = instance.run()
    if trials.defines(cls, "save") and instance.should_stop():
        instance.save(checkpoint)
        return adaptdl.CHECKPOINTED_EXIT
    if result is not None:
        trialkit.report_final_result(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
