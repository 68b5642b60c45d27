"""groklens.checkpoints: the HDF5 trajectory format (docs/FORMAT.md): write, read, recover."""

from groklens.checkpoints.constants import FORMAT_VERSION, sidecar_path
from groklens.checkpoints.reader import Trajectory, open_trajectory_file
from groklens.checkpoints.recovery import recover
from groklens.checkpoints.writer import TrajectoryWriter

__all__ = ["Trajectory", "TrajectoryWriter", "recover", "open_trajectory_file", "sidecar_path", "FORMAT_VERSION"]
