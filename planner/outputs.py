"""Where a command's result goes: an output path checked before any work, and every file written whole or not at
all (under a temporary name, renamed over the real one at the end), so that a command interrupted or failing
half-way leaves no partial file."""
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

from .errors import MemplanError
from .interrupt import check as check_interrupt


def check_output(path):
    """Refuse, before any work, an output path that cannot be written: a missing directory, a directory,
    or a file without write permission."""
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise MemplanError(f"-o {path}: is a directory; give a file name")
    if not os.path.isdir(folder):
        raise MemplanError(f"-o {path}: the directory {folder} does not exist")
    if not os.access(path if os.path.exists(path) else folder, os.W_OK):
        raise MemplanError(f"-o {path}: no permission to write there")


@contextmanager
def written(path):
    """The path to write `path` at, and any files beside it (a plan's .npz): in a temporary folder beside it, whose
    files replace the real ones when the block ends without an error and are removed when it does not. A path that
    is a symbolic link or not a regular file (/dev/stdout, a pipe) is written as it is."""
    path = Path(path)
    if path.is_symlink() or (path.exists() and not path.is_file()):
        yield path
        return
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.name}.") as folder:
        yield Path(folder) / path.name
        check_interrupt()
        for made in sorted(Path(folder).iterdir()):
            os.replace(made, path.parent / made.name)


def emit(args, text):
    """Print the command's result, or write it to -o when given."""
    if not getattr(args, "output", None):
        print(text)
        return
    try:
        with written(args.output) as path, open(path, "w") as f:
            f.write(text + "\n")
    except OSError as e:
        raise MemplanError(f"-o {args.output}: cannot write ({e.strerror})") from None
    print(f"wrote {args.output}")


def as_csv(rows):
    """Rows (flat dicts with the same keys) as CSV text."""
    import csv
    import io
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue().rstrip("\n")
