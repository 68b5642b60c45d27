"""groklens.trainers: tasks, models, regularizers, the training loop and sweeps."""
