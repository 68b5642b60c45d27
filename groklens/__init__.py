"""groklens: train grokking models, keep HDF5 checkpoint trajectories, measure mechanisms.

The rooms are sub-packages: groklens.trainers, groklens.checkpoints, groklens.probes,
groklens.analyses. Heavy imports (torch, transformer_lens) happen lazily.
"""

__version__ = "0.1.0"
