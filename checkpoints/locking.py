"""A writer lock on the trajectory file itself, so `--resume` never races a live trainer.

HDF5 takes flock() locks of its own (and a SWMR writer releases them so readers can open), so
we use an open-file-description POSIX lock (F_OFD_SETLK) instead: it neither conflicts with
flock nor is released when some other descriptor of the same file is closed in this process.
Where OFD locks do not exist, lockf is the fallback (released by any close of the file in the
writing process; groklens never reads a run from the process that writes it).
"""

from __future__ import annotations

import fcntl
import os
import struct

_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", None)
_OFD_GETLK = getattr(fcntl, "F_OFD_GETLK", None)


def _flock_struct(lock_type: int) -> bytes:
    # struct flock {short l_type; short l_whence; off_t l_start; off_t l_len; pid_t l_pid;}
    return struct.pack("hhqqi", lock_type, os.SEEK_SET, 0, 0, 0) + b"\0" * 4


class WriterLock:
    """Hold an exclusive lock on `path` while this object lives (until release())."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_RDWR)
        try:
            if _OFD_SETLK is not None:
                fcntl.fcntl(self.fd, _OFD_SETLK, _flock_struct(fcntl.F_WRLCK))
            else:  # pragma: no cover - non-Linux
                fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self.fd)
            raise

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the description drops the OFD lock
            self.fd = None


def not_writable(exc: OSError) -> bool:
    """The lock failed because the file cannot be opened for writing (not because it is held)."""
    import errno

    return exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ETXTBSY)


def writer_alive(path) -> bool:
    """True when another process holds the writer lock on `path` (a run is being written)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        if _OFD_GETLK is not None:
            res = fcntl.fcntl(fd, _OFD_GETLK, _flock_struct(fcntl.F_RDLCK))
            return struct.unpack("hhqqi", res[:28])[0] != fcntl.F_UNLCK
        try:  # pragma: no cover - non-Linux
            fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
        except OSError:
            return True
    finally:
        os.close(fd)


def lock_holder(path) -> int | None:
    """The pid of the process holding the writer lock on `path`, where /proc tells (Linux):
    OFD locks report pid -1 to F_GETLK, but /proc/<pid>/fdinfo lists the locks of each open file."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino} "
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fdinfo")
        except OSError:
            continue
        for fd in fds:
            try:
                with open(f"/proc/{pid}/fdinfo/{fd}") as fh:
                    text = fh.read()
            except OSError:
                continue
            if f"ino:\t{st.st_ino}\n" in text and any(
                    ("OFDLCK" in ln or "POSIX" in ln) and "WRITE" in ln and dev in ln
                    for ln in text.splitlines() if ln.startswith("lock:")):
                return pid
    return None


def describe_holder(path) -> str:
    """'pid N' of the live writer of `path`, or 'another process' where it cannot be told."""
    pid = lock_holder(path)
    return f"pid {pid}" if pid is not None else "another process"
