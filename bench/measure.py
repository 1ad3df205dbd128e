"""Measuring: durability (fsync), cold reads, peak RSS from /proc, facts about the machine."""

from __future__ import annotations

import contextlib
import datetime as _dt
import importlib.metadata
import os
import platform
import statistics
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "AnonPeakSampler",
    "drop_file_cache",
    "free_page_reporting",
    "fsync_tree",
    "machine_info",
    "median",
    "proc_status",
    "reset_peak_rss",
]


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _files(root: str) -> Iterator[str]:
    for dirpath, _, names in os.walk(root):
        for n in names:
            yield os.path.join(dirpath, n)


def fsync_tree(root: str) -> None:
    """fsync every file under ``root``, then each directory: what a durable save must pay.

    Applied after every system's save inside the timed region, so all rows are measured
    durable. For files a system already fsynced this costs one cheap syscall each.
    """
    dirs = []
    for dirpath, _, names in os.walk(root):
        dirs.append(dirpath)
        for n in names:
            fd = os.open(os.path.join(dirpath, n), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    for d in dirs:
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def drop_file_cache(root: str) -> None:
    """Evict the (clean, fsynced) pages of every file under ``root`` from the page cache."""
    for path in _files(root):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def proc_status() -> dict[str, int]:
    """The ``kB`` fields of /proc/self/status, in bytes (VmRSS, VmHWM, RssAnon, ...)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            parts = rest.split()
            if len(parts) == 2 and parts[1] == "kB":
                out[name] = int(parts[0]) * 1024
    return out


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux ≥ 4.0); False when the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


class AnonPeakSampler:
    """Samples RssAnon every ``interval`` seconds in a thread; ``peak`` is the largest seen.

    VmHWM also counts file pages a reader maps (mmap of /dev/shm or page cache); anonymous
    memory is what a process really allocates. Sampling can miss a short spike, so this is a
    lower bound, reported next to VmHWM rather than instead of it.
    """

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        self.peak = proc_status().get("RssAnon", 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, proc_status().get("RssAnon", 0))

    def __enter__(self) -> AnonPeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, proc_status().get("RssAnon", 0))


def _version(*dists: str) -> str:
    for d in dists:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(d)
    return "not installed"


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _mem_total() -> int:
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


def _fs_type(path: str) -> str:
    """Filesystem type of the mount holding ``path`` (longest matching mount point)."""
    best, kind = "", "unknown"
    target = os.path.realpath(path)
    with contextlib.suppress(OSError), open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            mount, fstype = parts[1], parts[2]
            inside = target == mount or target.startswith(mount.rstrip("/") + "/")
            if inside and len(mount) > len(best):
                best, kind = mount, fstype
    return kind


def free_page_reporting() -> bool:
    """True on a VM whose virtio-balloon hands freed guest memory back to the host.

    There, memory freed a few seconds ago must be faulted in from the host again when reused:
    any system that allocates fresh memory (new arrays, page cache for a new file) now and
    then pays for it. It is the largest noise source the harness knows of.
    """
    for dev in Path("/sys/bus/virtio/devices").glob("virtio*"):
        with contextlib.suppress(OSError, ValueError):
            if int((dev / "device").read_text(), 16) != 5:  # 5: memory balloon
                continue
            bits = (dev / "features").read_text().strip()
            if len(bits) > 5 and bits[5] == "1":  # VIRTIO_BALLOON_F_REPORTING
                return True
    return False


def _git_commit(repo: Path) -> str:
    try:
        head = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=True, timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, check=True, timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}{' (uncommitted changes)' if dirty else ''}"


def machine_info(repo: Path, locations: dict[str, str]) -> dict[str, str]:
    """What the reader of the numbers needs to know about where they came from."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 0
    info = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "trackpoint commit": _git_commit(repo),
        "cpus (nproc)": str(cpus),
        "cpu": _cpu_model(),
        "memory": f"{_mem_total() / 2**30:.1f} GiB",
        "kernel": platform.release(),
        "free page reporting": "on (virtio-balloon)" if free_page_reporting() else "off",
        "python": platform.python_version(),
        "numpy": _version("numpy"),
        "ml_dtypes": _version("ml_dtypes"),
        "torch": _version("torch"),
        "tensorflow": _version("tensorflow-cpu", "tensorflow"),
        "safetensors": _version("safetensors"),
        "orbax-checkpoint": _version("orbax-checkpoint"),
    }
    for name, path in locations.items():
        info[f"{name} filesystem"] = f"{_fs_type(path)} ({path})"
    info["executable"] = sys.executable
    return info
