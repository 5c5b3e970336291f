"""The AdaptDL-on-Ray guide's command, as it prints it, run from this folder:

    python3 adaptdl_ray.py -f main.py -m 3 -u ray://HEAD_IP:10001 -- -autoscale-bsz

is `adaptdl-ray` (trialkit.ray.adaptdl_ray) with the same arguments: README.md says what it does.
"""
import sys

from trialkit.ray.adaptdl_ray import main

if __name__ == "__main__":
    sys.exit(main())
