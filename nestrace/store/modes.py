"""Who may read what nestrace writes: its user alone by default, a group
when asked (--group).  Light: the command line reads it before any
command."""
from __future__ import annotations

import os

from nestrace.errors import StoreError

# the user's own umask, for the commands nestrace runs (a workload):
# nestrace's own files are its user's alone (private_files)
USER_UMASK_ENV = "NESTRACE_USER_UMASK"


def private_files() -> None:
    """From now on what this process makes is readable by its owner only
    (umask 077 added to the user's), whatever the umask; the user's is
    kept for the commands it runs (user_umask)."""
    old = os.umask(0o077)
    os.environ.setdefault(USER_UMASK_ENV, oct(old))
    os.umask(old | 0o077)


def user_umask() -> int:
    """The umask the user gave nestrace (a workload runs with it)."""
    try:
        return int(os.environ.get(USER_UMASK_ENV, ""), 8)
    except ValueError:
        old = os.umask(0)
        os.umask(old)
        return old


def group_id(group: str) -> int:
    """--group NAME's id; StoreError when there is no such group."""
    import grp
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise StoreError(f"--group {group}: no such group") from None
