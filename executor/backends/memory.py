"""How much memory this process can still allocate, and the one-line refusal of what will not fit. On the host
the room is the tightest of: the memory the system says is available, the commit limit under strict overcommit,
the memory cgroup's limit (a container's), and the address-space and data limits (ulimit -v, -d) less what the
process already maps. A limit that cannot be read is left out; with none known nothing is refused."""
import os
from contextlib import contextmanager

from planner.errors import OutOfMemoryError
from planner.units import format_bytes

UNLIMITED = 1 << 60
"""A cgroup limit at least this large is no limit (cgroup v1 writes 2^63 less a page for none)."""
CGROUPS = {"v2": ("/sys/fs/cgroup", "memory.max", "memory.current", "inactive_file"),
           "v1": ("/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")}
"""Where each cgroup version keeps a group's memory limit, its usage and its reclaimable page cache."""


def check(nbytes, what, room):
    """Raise OutOfMemoryError when `what` (its `nbytes`) exceeds `room`, (bytes, where) or None when unknown."""
    if room is not None and nbytes > room[0]:
        raise refusal(nbytes, what, room)


def refusal(nbytes, what, room, cause=None):
    """The OutOfMemoryError for `what`: the bytes needed, the `room` (bytes, where) when known, and the `cause` of an
    allocation that failed."""
    found = "" if room is None else f", {format_bytes(room[0])} ({room[0]:,} bytes) {room[1]}"
    failed = f" ({cause})" if cause else ""
    return OutOfMemoryError(f"not enough memory for {what}: {format_bytes(nbytes)} ({nbytes:,} bytes) needed{found}"
                            f"{failed}; use a smaller batch")


@contextmanager
def allocating(nbytes, what, room):
    """A block that allocates `what` (`nbytes`): a MemoryError in it (NumPy's, CuPy's) becomes the one-line
    OutOfMemoryError, with the room `room()` then finds."""
    try:
        yield
    except MemoryError as e:
        cause = first_line(e)
        raise refusal(nbytes, what, room(), f"the allocation failed: {cause}" if cause else "the allocation failed") \
            from None


def first_line(error):
    """The first line of an error's message ('' for none): numba's run to several lines of hints."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else ""


def host_room():
    """(bytes, where) of the tightest limit on new host allocations that is known, or None."""
    meminfo = _fields("/proc/meminfo")
    limits = [_available(meminfo), _committable(meminfo), _cgroup(),
              _rlimit("RLIMIT_AS", "VmSize", "address-space", "-v", "mapped"),
              _rlimit("RLIMIT_DATA", "VmData", "data", "-d", "in data")]
    return min((limit for limit in limits if limit), default=None, key=lambda limit: limit[0])


def _fields(path):
    """{name: bytes} of a /proc file of 'Name:   123 kB' lines; {} where it cannot be read."""
    try:
        with open(path) as f:
            lines = [line.split(":", 1) for line in f if ":" in line]
        return {name: int(value.split()[0]) * (1024 if value.strip().endswith("kB") else 1)
                for name, value in lines if value.split() and value.split()[0].isdigit()}
    except OSError:
        return {}


def _available(meminfo):
    """The memory the system can give without swapping: MemAvailable, else the free pages (os.sysconf)."""
    free = meminfo.get("MemAvailable")
    if free is None:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            return None
    return free, "available on the host"


def _committable(meminfo):
    """Under vm.overcommit_memory=2 the kernel refuses what passes CommitLimit: the commit still free."""
    try:
        with open("/proc/sys/vm/overcommit_memory") as f:
            strict = f.read().strip() == "2"
    except OSError:
        return None
    if not strict or "CommitLimit" not in meminfo or "Committed_AS" not in meminfo:
        return None
    left = max(meminfo["CommitLimit"] - meminfo["Committed_AS"], 0)
    limit = format_bytes(meminfo["CommitLimit"])
    return left, f"available under the host's commit limit (vm.overcommit_memory=2, {limit})"


def _rlimit(kind, field, noun, flag, held):
    """A resource limit of the process (the `noun` limit, ulimit `flag`) less the bytes it already holds against it
    (/proc/self/status `field`)."""
    try:
        import resource
        soft = resource.getrlimit(getattr(resource, kind))[0]
    except (ImportError, AttributeError, OSError, ValueError):
        return None
    used = _fields("/proc/self/status").get(field)
    if soft == resource.RLIM_INFINITY or used is None:
        return None
    return max(soft - used, 0), (f"available under the {noun} limit (ulimit {flag} {format_bytes(soft)}, "
                                 f"{format_bytes(used)} {held})")


def _cgroup():
    """The room of the process's memory cgroup: the tightest of its and its ancestors' limits less what each
    charges, the inactive page cache (which the kernel reclaims first) counted as free; None without a limit."""
    try:
        with open("/proc/self/cgroup") as f:
            entries = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return None
    levels = []
    for entry in entries:
        if len(entry) == 3 and (entry[1] == "" or "memory" in entry[1].split(",")):
            root, *files = CGROUPS["v2" if entry[1] == "" else "v1"]
            levels += filter(None, (_cgroup_level(folder, *files) for folder in _ancestors(root, entry[2])))
    if not levels:
        return None
    limit, used = min(levels, key=lambda level: level[0] - level[1])
    return max(limit - used, 0), (f"available in the memory cgroup (limit {format_bytes(limit)}, "
                                  f"{format_bytes(max(used, 0))} in use)")


def _ancestors(root, path):
    """The folders of cgroup `path` under `root`, the group's own first, then its parents' to the root; the root
    alone where the path is not there (a container seeing its own group as the root)."""
    folder = os.path.normpath(os.path.join(root, path.lstrip("/")))
    if not os.path.isdir(folder):
        return [root]
    folders = [folder]
    while folder != os.path.normpath(root) and folder != os.path.dirname(folder):
        folder = os.path.dirname(folder)
        folders.append(folder)
    return folders


def _cgroup_level(folder, limit_file, usage_file, cache_field):
    """(limit, bytes charged less the inactive page cache) of one cgroup folder; None without a limit."""
    try:
        with open(os.path.join(folder, limit_file)) as f:
            limit = f.read().strip()
        if limit == "max" or int(limit) >= UNLIMITED:
            return None
        with open(os.path.join(folder, usage_file)) as f:
            used = int(f.read().strip())
        with open(os.path.join(folder, "memory.stat")) as f:
            stat = dict(line.split()[:2] for line in f if len(line.split()) >= 2)
        return int(limit), used - int(stat.get(cache_field, 0))
    except (OSError, ValueError):
        return None
