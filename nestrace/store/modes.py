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


# `record --redact`: a store's own secret, beside it (its owner's alone),
# so that one name gets one hash within the store and another store's
# hashes do not match it
SALT_FILE = "_redact_salt"


def redactor(store):
    """value -> its hash ("h:" and 16 hex digits; "" stays ""), keyed by
    the store's own salt (made the first time)."""
    import hashlib
    import secrets
    from pathlib import Path
    path = Path(store) / SALT_FILE
    try:
        salt = path.read_bytes()
    except FileNotFoundError:
        salt = secrets.token_bytes(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(salt)
    cache: dict[str, str] = {}

    def hash_of(value: str | None) -> str | None:
        if not value:
            return value
        h = cache.get(value)
        if h is None:
            h = cache[value] = "h:" + hashlib.blake2b(value.encode(), key=salt[:32],
                                                      digest_size=8).hexdigest()
        return h
    return hash_of
