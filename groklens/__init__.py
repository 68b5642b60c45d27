"""groklens: train grokking models, keep HDF5 checkpoint trajectories, measure mechanisms.

The rooms are sub-packages: groklens.models, groklens.checkpoints, groklens.probes,
groklens.trainers, groklens.analyses, groklens.sweeps, groklens.experiments (docs/DESIGN.md:
what each may import). Heavy imports (torch, transformer_lens) happen lazily.
"""

__version__ = "0.1.0"
