"""The directory the keeper puts first on the training process's PYTHONPATH when
periodic AdaptDL checkpoints are on: `sitecustomize` (the import hook) and the
hook itself. See sitecustomize.py for why it is done this way."""
