"""Who and where this process is, for the IPC same-node / same-PID-namespace check."""

from __future__ import annotations

import os
import socket
from functools import cache


@cache
def node_identity() -> tuple[str, str, int]:
    """(hostname, boot id, PID namespace inode); fixed for the life of the process. Empty/0 when unknown."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot_id = f.read().strip()
        pid_ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        boot_id, pid_ns = "", 0
    return socket.gethostname(), boot_id, pid_ns
