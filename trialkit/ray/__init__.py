"""What runs inside a Ray cluster: the trial runner actor (a keeper on a node),
the elastic AdaptDL controller (`adaptdl-ray`), and the spot-notice watcher.
ray itself is imported only where it is used."""
