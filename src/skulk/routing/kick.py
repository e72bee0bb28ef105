"""Kick zenoh's own threads out of a wait: a no-op signal to each of them (Linux only).

Why: on a healthy node that stays linked to a peer which just lost another link (issue 18,
network cut of a third node), bytes from the peer can pile up unread in the socket's receive
queue while every zenoh thread (`rx-*`, `tx-*`, `net-*`, ...) sits in `epoll_wait` or on a
condvar and nothing ever wakes them: a missed wake-up in zenoh's runtime. Attaching a debugger
(ptrace interrupts every thread's wait) ended it within half a second every time; an
interrupted `epoll_wait` returns EINTR and tokio's driver simply polls again, seeing the ready
socket. The kick does the same thing without a debugger: a signal whose handler does nothing.

A signal only interrupts a wait when a handler is installed (an ignored signal, the default for
SIGURG, is discarded by the kernel without waking anything), so `install()` puts Python's
handler on `KICK_SIGNAL` (its C part only sets a flag; the Python part is a no-op run later on
the main thread). Only zenoh's threads are signalled, by thread id (tgkill): Python's threads
would retry an interrupted call anyway (PEP 475), but nothing is gained by waking them.

Elsewhere than Linux (no /proc/self/task, no tgkill) every function here is a no-op that says
so by returning False / 0.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import signal
import sys
import threading
from pathlib import Path
from typing import Final

log = logging.getLogger("skulk.routing")

ZENOH_THREAD_PREFIXES: Final = ("rx-", "tx-", "net-", "acc-", "app-")
"""zenoh names the threads of its runtimes after them (zenoh-runtime: rx, tx, net, acc, app)."""

KICK_SIGNAL: Final = getattr(signal, "SIGURG", None)
"""Used by nothing in this process (SIGURG reports out-of-band TCP data only to a process that
asked for it with F_SETOWN); its default action is to ignore it, so a stray one harms nothing."""

_SYS_TGKILL: Final = {"x86_64": 234, "aarch64": 131, "arm64": 131}

_installed = False


def supported() -> bool:
    """Linux with a known tgkill syscall number and a SIGURG: the kick can work here."""
    return sys.platform == "linux" and KICK_SIGNAL is not None and platform.machine() in _SYS_TGKILL


def _noop(signum: int, frame: object) -> None:
    """The handler: its only job is to exist (see the module docstring)."""


def install() -> bool:
    """Install the no-op handler on KICK_SIGNAL. Only possible from the main thread (Python's
    rule); keeps a handler someone else installed (it interrupts waits just as well). True when
    a handler is in place."""
    global _installed
    if not supported() or KICK_SIGNAL is None:
        return False
    if _installed:
        return True
    current = signal.getsignal(KICK_SIGNAL)
    if callable(current):
        _installed = True
        return True
    if threading.current_thread() is not threading.main_thread():
        log.info("zenoh kick unavailable: its signal handler can only be installed from the main thread")
        return False
    signal.signal(KICK_SIGNAL, _noop)
    _installed = True
    return True


def zenoh_thread_ids() -> list[int]:
    """Thread ids of this process whose names are zenoh's runtime threads."""
    found: list[int] = []
    try:
        tasks = list(Path("/proc/self/task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            name = (task / "comm").read_text().strip()
        except OSError:
            continue  # the thread ended meanwhile
        if name.startswith(ZENOH_THREAD_PREFIXES):
            found.append(int(task.name))
    return found


def kick() -> int:
    """Send KICK_SIGNAL to every zenoh thread of this process; how many were signalled (0 when
    unsupported or no handler is installed: an unhandled SIGURG would wake nothing)."""
    if not _installed or not supported() or KICK_SIGNAL is None:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    number = _SYS_TGKILL[platform.machine()]
    pid = os.getpid()
    sent = 0
    for tid in zenoh_thread_ids():
        if libc.syscall(number, pid, tid, int(KICK_SIGNAL)) == 0:
            sent += 1  # a thread gone meanwhile (ESRCH) is simply not counted
    return sent


__all__ = ["KICK_SIGNAL", "ZENOH_THREAD_PREFIXES", "install", "kick", "supported", "zenoh_thread_ids"]
