"""In-container launchers: `python -m trialkit.launch.<engine>` starts a trial's
distributed workers (torchrun, DeepSpeed, horovodrun, each rank under wrap_rank)
and stops them all when one fails. Not to be confused with launchers/ at the
top of the checkout, which holds the Kubernetes job templates the platforms
render."""
