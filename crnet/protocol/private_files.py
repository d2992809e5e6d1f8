"""Files that hold a credential: the cluster secret, the metrics token, the TLS key.

A credential other users can read is theirs too; one they can write, or replace, is
theirs to choose (a secret of their own admits their hosts). A file can be replaced
by whoever owns it or any directory above it, and by whoever may write to one of
those directories. So ``check_private`` refuses a file unless:

- it belongs to this process's user or root, and grants others nothing (mode 600; its
  group may read it, 640, unless that group is the training processes' own,
  ``--client-group``: they run untrusted code);
- every directory from its own up to ``/`` belongs to this user or root, and none is
  writable by its group or others unless it is sticky (``/tmp``: there only an
  entry's owner may rename or remove it, and each entry below was checked to be ours).

The checks follow the path's symbolic links (``os.path.realpath``), as opening it does.
``ValueError`` names the file, what is wrong and how to fix it.
"""

from __future__ import annotations

import os
import stat

__all__ = ["check_private"]


def check_private(path: str | os.PathLike, st: os.stat_result, what: str,
                  shared_gid: int | None = None) -> None:
    """Refuse ``path`` (``st``: the opened file's ``os.fstat``), a ``what`` ("a cluster
    secret"), if others may read, write or replace it. ``shared_gid``: a group that must
    not read it (the training processes')."""
    name = os.fspath(path)
    mode = stat.S_IMODE(st.st_mode)
    if mode & (stat.S_IRWXG | stat.S_IRWXO) & ~stat.S_IRGRP:
        raise ValueError(f"{name} is readable or writable by other users (mode {mode:o}): "
                         f"chmod 600 (or 640) it")
    if mode & stat.S_IRGRP and shared_gid is not None and st.st_gid == shared_gid:
        raise ValueError(f"{name} is readable by its group {_group(st.st_gid)}, the training "
                         f"processes' (--client-group): they must not hold {what}; chmod 600 it")
    me = os.geteuid()
    if st.st_uid not in (me, 0):
        raise ValueError(f"{name} belongs to {_user(st.st_uid)}, who could change or replace "
                         f"{what}: it must belong to {_user(me)} or root (chown it, or run as "
                         f"its owner)")
    directory = os.path.dirname(os.path.realpath(name))
    while True:
        d = os.stat(directory)
        if d.st_uid not in (me, 0):
            raise ValueError(f"{name} is in {directory}, which belongs to {_user(d.st_uid)}: "
                             f"that user could replace {what}; keep it in a directory of "
                             f"{_user(me)} or root (e.g. /etc/crnet)")
        if stat.S_IMODE(d.st_mode) & (stat.S_IWGRP | stat.S_IWOTH) and not d.st_mode & stat.S_ISVTX:
            raise ValueError(f"{name} is in {directory} (mode {stat.S_IMODE(d.st_mode):o}), "
                             f"which other users may write to: they could replace {what}; "
                             f"chmod go-w {directory}")
        parent = os.path.dirname(directory)
        if parent == directory:
            return
        directory = parent


def _user(uid: int) -> str:
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _group(gid: int) -> str:
    import grp

    try:
        return f"{grp.getgrgid(gid).gr_name} (gid {gid})"
    except KeyError:
        return f"gid {gid}"
