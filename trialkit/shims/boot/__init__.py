"""The directory the keeper puts on the training process's PYTHONPATH: its
`sitecustomize` installs the finder of trialkit's fallback packages (see
trialkit/shims/__init__.py)."""
