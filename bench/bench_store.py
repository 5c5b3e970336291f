"""The store alone under keepers' batches: its CPU per record, against a git revision's store.

    .venv/bin/python bench/bench_store.py --baseline main [--trials 200] [--batches 20] [--rounds 10]

Each run is a process of its own on a fresh store of --trials trials, from
one tree's trialkit/ (this one, or REV's, checked out as bench_manager.py
does): --batches rounds of one 50-record batch per trial, stored in group
commits of 20 batches (Store.add_batches, as manager/commits.py groups
them), timed in the process's CPU seconds (on a shared machine, less noisy
than the clock). Two cases of the keeper-to-store path:
- `first`: each trial's first spool, as every trial's first run ships (base 0);
- `later`: a spool that came after another (a trial started again on a new
  pod or node), whose seqs the store keeps above a base of 2^40.
A store without spools (before they had ids) is sent the same seqs as this
one stores, so that the race is the code and not the size of the numbers
(SQLite keeps an integer in 1 to 8 bytes: seqs past 2^40 take 6).
--rounds rounds, the order reversed every other round; printed: each case's
median CPU per record of each tree, their ratio and MET/MISSED against the
goal (this tree within GOAL_RATIO of the baseline).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench_manager import ROOT, checkout

GOAL_RATIO = 1.05
BATCH = 50
GROUP = 20

RUN = """
import json, sys, tempfile, time
from pathlib import Path
from trialkit import records
from trialkit.manager.store import Store

case, trials, batches, batch, group = sys.argv[1], *map(int, sys.argv[2:6])
spools = hasattr(records, "SPOOL_SEQS")
store = Store.in_dir(Path(tempfile.mkdtemp(prefix="bench-store-")))
store.create_experiment("e")
for t in range(trials):
    store.add_trial("e", f"t{t}", sequence=t, parameters={}, token=None)
first = 1
if case == "later":
    first = (1 << 40) + 1  # where the store keeps a second spool's seq 1
    for t in range(trials):
        if spools:  # an earlier spool's record: the measured spool is given the base above it
            store.add_batches([(f"t{t}", "earlier", [{"seq": 1, "type": "PERIODICAL", "value": 0.0}], [])])
        else:  # the trial's ack just below the seqs it is sent: its usual way, as for the spool above
            with store._tx() as db:
                db.execute("UPDATE trials SET acked_seq=? WHERE id=?", (first - 1, f"t{t}"))
spent = 0.0
for n in range(batches):
    made = []
    for t in range(trials):
        seq = n * batch + 1 if spools else first + n * batch
        recs = [{"seq": seq + i, "type": "PERIODICAL", "sequence": seq + i, "value": 0.5, "time": 1.0,
                 "parameter_id": 0, "trial_job_id": f"t{t}", "source": "channel", "run": 0} for i in range(batch)]
        made.append((f"t{t}", "measured", recs, []) if spools else (f"t{t}", recs, []))
    start = time.process_time()
    for i in range(0, len(made), group):
        for outcome in store.add_batches(made[i:i + group]):
            assert not isinstance(outcome, Exception) and outcome.acked == (n + 1) * batch + (0 if spools else first - 1)
    spent += time.process_time() - start
held = [r["seq"] for r in store.records_for("t0") if r["sequence"] is not None]
assert held[0] == first and len(held) == batches * batch, (held[:3], len(held))
print(json.dumps(spent / (trials * batches * batch) * 1e6))
"""


def run(root: Path, case: str, opts: argparse.Namespace) -> float:
    """CPU microseconds a record, of one store run from the trialkit/ under root."""
    done = subprocess.run([sys.executable, "-c", RUN, case, str(opts.trials), str(opts.batches), str(BATCH),
                           str(GROUP)], cwd=root, capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(root)})
    return json.loads(done.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", metavar="REV", required=True, help="race the store of this git revision")
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--batches", type=int, default=20, help="batches per trial in a run")
    parser.add_argument("--rounds", type=int, default=10)
    opts = parser.parse_args()
    baseline = checkout(opts.baseline)
    met = True
    for case in ("first", "later"):
        spent = {"baseline": [], "this tree": []}
        for r in range(opts.rounds):
            order = [("baseline", baseline), ("this tree", ROOT)]
            for name, root in order if r % 2 == 0 else reversed(order):
                spent[name].append(run(root, case, opts))
        before, after = (statistics.median(spent[name]) for name in ("baseline", "this tree"))
        ratio = after / before
        met = met and ratio <= GOAL_RATIO
        runs = ", ".join(f"{b:.2f}/{a:.2f}" for b, a in zip(spent["baseline"], spent["this tree"]))
        print(f"{case}: CPU a record, median of {opts.rounds} runs each: {opts.baseline} {before:.2f} us, this tree "
              f"{after:.2f} us; {ratio:.3f}x (runs: {runs}); goal <= {GOAL_RATIO}x: "
              f"{'MET' if ratio <= GOAL_RATIO else 'MISSED'}", flush=True)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
