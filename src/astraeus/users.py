"""The machine's users, as the agent's settings name them (ASTRAEUS_WORKER_USER). Pure: imported by
astraeus.settings (its check of the variable) and by the agent's runtime."""

from __future__ import annotations


def resolve_user(user: str) -> tuple[int, int]:
    """(uid, gid) of a configured user (a name or a number); ValueError if unknown or root."""
    import pwd

    try:
        pw = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
        uid, gid = pw.pw_uid, pw.pw_gid
    except KeyError:
        if not user.isdigit():
            raise ValueError(f"no user named {user!r} on this machine") from None
        uid = gid = int(user)
    if uid == 0 or gid == 0:
        raise ValueError(f"{user!r} is root (uid or gid 0); workers must run as an unprivileged user")
    return uid, gid
