"""What runs inside a Ray cluster: the trial runner actor (a keeper on a node),
the elastic AdaptDL controller (`adaptdl-ray`), the spot-notice watcher, and
Horovod's workers across nodes without ssh (`python -m trialkit.ray.horovod`).
ray itself is imported only where it is used."""
