"""groklens.trainers: models, losses, regularizers, the training step and loop, the entry points
(train, resume) and sweeps. The tasks are the front door's (groklens/tasks.py)."""

import groklens as _top

if getattr(_top, "__file__", None) is None:  # a folder named groklens (the clone) shadows the installed package
    raise ImportError(f"the folder {list(_top.__path__)[0]} shadows the installed groklens: Python found it first "
                      "(the current directory or the script's); run from another directory, or rename the clone "
                      "(README, 'Importing groklens')")
