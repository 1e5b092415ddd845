"""Real local users for tests of a shared server (made with ``useradd``, where we are root).

``LocalUser.make("nbrpc-student1")`` makes the user (once per machine) and a fresh home
for it; ``popen_options()`` runs a process as that user, with this machine's system
Python and this environment's packages (the interpreter of our virtual environment
lives where other users cannot enter). ``unavailable()`` says why these tests cannot
run here, or None.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import nbrpc

ROOT = Path(nbrpc.__file__).resolve().parent.parent
SYSTEM_PYTHON = "/usr/bin/python3"
# Debian's Python 3.11.2 mishandles possessive quantifiers (its `re`, fixed in 3.11.5),
# which this environment's soupsieve 4 uses (nbconvert's HTML export selects with it):
# the users get Debian's soupsieve, which .ci/system-packages.sh installs.
DEBIAN_SOUPSIEVE = Path("/usr/lib/python3/dist-packages/soupsieve")


def unavailable() -> str | None:
    if os.geteuid() != 0 or not shutil.which("useradd"):
        return "needs root and useradd to make local users"
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return f"needs {SYSTEM_PYTHON}, a Python other users can run"
    done = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print(sys.version_info[:2])"],
                          capture_output=True, text=True)
    if done.stdout.strip() != str(tuple(sys.version_info[:2])):
        return (f"{SYSTEM_PYTHON} is Python {done.stdout.strip()}, this environment's packages are for "
                f"{sys.version_info[:2]}")
    for folder in (ROOT, sysconfig.get_paths()["purelib"]):
        if not _readable_by_all(Path(folder)):
            return f"{folder} is not readable by other users"
    return None


@dataclass
class LocalUser:
    name: str
    uid: int
    gid: int
    home: Path
    # What the server this user's processes run under passes them (a hub's Spawner.environment).
    extra_env: dict[str, str] = field(default_factory=dict)
    # A network namespace (``ip netns`` name) its processes run in: a server of their own.
    netns: str | None = None

    @classmethod
    def make(cls, name: str) -> LocalUser:
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                           check=True)
        entry = pwd.getpwnam(name)
        # Short: the kernels' Unix sockets live under it when TMPDIR points there.
        home = Path(tempfile.mkdtemp(prefix="u-"))
        if DEBIAN_SOUPSIEVE.is_dir():
            (home / ".compat").mkdir()
            (home / ".compat" / "soupsieve").symlink_to(DEBIAN_SOUPSIEVE)
        os.chown(home, entry.pw_uid, entry.pw_gid)
        return cls(name, entry.pw_uid, entry.pw_gid, home)

    def environment(self) -> dict[str, str]:
        """A clean login-like environment with nbrpc and its packages importable."""
        compat = [str(self.home / ".compat")] if (self.home / ".compat").is_dir() else []
        path = os.pathsep.join([*compat, str(ROOT), sysconfig.get_paths()["purelib"]])
        return {"HOME": str(self.home), "USER": self.name, "PATH": "/usr/bin:/bin", "PYTHONPATH": path,
                "NBRPC_TEST_RUN": os.environ.get("NBRPC_TEST_RUN", ""), **self.extra_env}

    def popen_options(self) -> dict:
        """Popen's options to run as this user; ``prefix`` goes before the interpreter's command."""
        if self.netns is None:
            return {"executable": SYSTEM_PYTHON, "prefix": [], "user": self.uid, "group": self.gid,
                    "extra_groups": [], "env": self.environment()}
        # Into the namespace as root, then down to the user (setpriv and nsenter exec: one pid).
        prefix = ["nsenter", f"--net=/run/netns/{self.netns}", "--", "setpriv", f"--reuid={self.uid}",
                  f"--regid={self.gid}", "--clear-groups", "--"]
        return {"executable": SYSTEM_PYTHON, "prefix": prefix, "env": self.environment()}

    def remove_home(self) -> None:
        shutil.rmtree(self.home, ignore_errors=True)


def _readable_by_all(folder: Path) -> bool:
    for part in [folder, *folder.parents]:
        if not part.stat().st_mode & 0o005 == 0o005:
            return False
    return True
