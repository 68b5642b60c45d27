"""Every file, group and attribute name of the trajectory format, in one place (docs/FORMAT.md)."""

FORMAT_NAME = "groklens-trajectory"
FORMAT_VERSION = 1  # bump on any incompatible schema change; readers refuse newer versions

# root attributes
ATTR_FORMAT = "format"
ATTR_FORMAT_VERSION = "format_version"
ATTR_GROKLENS_VERSION = "groklens_version"
ATTR_CONFIG = "config"  # RunConfig as JSON
ATTR_CREATED = "created"
ATTR_CONFIG_SHA256 = "config_sha256"  # sha256 of the config attribute (since 1.1; absent in older files)
# JSON list of step-cap extensions (`train --resume RUN --steps N`), oldest first: the config
# attribute stays as the run began (its checksum verifies), the last extension's steps is the cap
ATTR_EXTENSIONS = "extensions"
ATTR_INTEGRITY = "integrity"  # "fletcher32": every dataset carries HDF5's checksum (since 1.3; absent: unverified)
INTEGRITY_FLETCHER32 = "fletcher32"

# groups and datasets
STEPS = "steps"  # int64 [n_checkpoints]; its length commits a checkpoint
PARAMS = "params"  # params/<name>: float32 [n_checkpoints, *shape] (copy 0 of a routed run)
COPIES = "copies"  # copies/<m>/<name>: copy m >= 1 of a routed run (routing_copies > 1), as params/
METRICS = "metrics"  # metrics/<name>: float64 [n_evals]
METRICS_STEP = "step"  # metrics/step: int64 [n_evals]; its length commits an evaluation row
STATE = "state"  # state/<name>: [2, *shape], double-buffered optimizer and RNG state
STATE_STEP = "step"  # state/step: int64 [2], the checkpoint step each slot holds (-1: empty)
DATA = "data"  # data/inputs, labels, train_idx, test_idx, informative_mask
STATUS = "status"  # fixed-length bytes [1]: running | completed | stopped: <why>
CPU_SECONDS = "cpu_seconds"  # float64 [1]: process CPU time the training loop took (since 1.2; absent in older files)
ANALYSES = "analyses"  # analyses/<name> in the sidecar file

STATUS_LENGTH = 512
SIDECAR_SUFFIX = ".analyses.h5"  # RUN.h5 -> RUN.analyses.h5


def sidecar_path(run_path, copy: int = 0):
    """Where `groklens analyze` keeps results for RUN.h5, so a run can be analyzed while training;
    copy m >= 1 of a routed run has its own, RUN.copy<m>.analyses.h5."""
    from pathlib import Path

    run_path = Path(run_path)
    return run_path.with_name(_stem(run_path.name) + (f".copy{copy}" if copy else "") + SIDECAR_SUFFIX)


def _stem(name: str) -> str:
    """RUN.h5 -> RUN; a name without .h5 keeps all of it plus '._', so runs `a` and `a.h5`
    never share a sidecar (each sidecar also records its run's name, checked on open)."""
    return name[: -len(".h5")] if name.endswith(".h5") else name + "._"


def copy_sidecar_paths(run_path) -> list:
    """The per-copy sidecars of RUN.h5 that exist (copies >= 1 of a routed run)."""
    from pathlib import Path

    run_path = Path(run_path)
    stem = _stem(run_path.name)
    return sorted(p for p in run_path.parent.glob(f"{stem}.copy*{SIDECAR_SUFFIX}")
                  if p.name[len(stem) + 5 : -len(SIDECAR_SUFFIX)].isdigit())
