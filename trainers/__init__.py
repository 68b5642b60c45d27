"""groklens.trainers: models, losses, regularizers, the training step and loop, the entry points
(train, resume) and sweeps. The tasks are the front door's (groklens/tasks.py)."""
