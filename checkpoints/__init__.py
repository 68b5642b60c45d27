"""groklens.checkpoints: the HDF5 trajectory format (docs/FORMAT.md): write, read, recover."""

import groklens as _top

if getattr(_top, "__file__", None) is None:  # a folder named groklens (the clone) shadows the installed package
    raise ImportError(f"the folder {list(_top.__path__)[0]} shadows the installed groklens: Python found it first "
                      "(the current directory or the script's); run from another directory, or rename the clone "
                      "(README, 'Importing groklens')")

from groklens.checkpoints.constants import FORMAT_VERSION, sidecar_path
from groklens.checkpoints.reader import Trajectory, open_trajectory_file
from groklens.checkpoints.recovery import recover
from groklens.checkpoints.writer import TrajectoryWriter

__all__ = ["Trajectory", "TrajectoryWriter", "recover", "open_trajectory_file", "sidecar_path", "FORMAT_VERSION"]
