"""A throwaway PostgreSQL cluster for the tests: ``initdb`` in a temp dir, served on a Unix
socket only (``listen_addresses=''``), stopped and removed at the end of the run.

Never assumes a running server. The binaries come from ``$PG_BIN``, ``PATH``, or
Debian's ``/usr/lib/postgresql/<version>/bin`` (``scripts/test`` installs the package
when they are missing). ``initdb`` refuses root, so as root the cluster runs as an
unprivileged user (``postgres`` when it exists, else ``nobody``) through ``runuser``,
with its temp dirs given to that user; the tests connect as that user, over the socket.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

__all__ = ["Cluster", "find_bin", "start_cluster"]


def find_bin() -> str | None:
    """The directory holding ``initdb`` and ``pg_ctl``, or None."""
    if os.environ.get("PG_BIN"):
        return os.environ["PG_BIN"]
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return os.path.dirname(found)
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                        key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    return os.path.dirname(candidates[-1]) if candidates else None


@dataclass
class Cluster:
    """A running throwaway server and how to reach it."""

    bin_dir: str
    root: str
    data: str
    socket_dir: str
    user: str
    as_user: list[str]

    @property
    def host_url(self) -> str:
        return f"postgresql://{self.user}@/postgres?host={self.socket_dir}"

    def url(self, db: str) -> str:
        return f"postgresql://{self.user}@/{db}?host={self.socket_dir}"

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.as_user, *argv], capture_output=True, text=True, check=check, timeout=120)

    def start(self) -> None:
        """``pg_ctl start`` (waits until it accepts connections)."""
        log = os.path.join(self.root, "server.log")
        opts = f"-c listen_addresses='' -k {self.socket_dir} -c fsync=off -c max_connections=200"
        result = self._run(os.path.join(self.bin_dir, "pg_ctl"), "-D", self.data, "-l", log, "-o", opts,
                           "-w", "-t", "60", "start", check=False)
        if result.returncode != 0:
            with open(log, errors="replace") as f:
                tail = f.read()[-2000:]
            raise RuntimeError(f"pg_ctl start failed: {result.stdout}{result.stderr}\n{tail}")

    def stop(self, mode: str = "fast") -> None:
        self._run(os.path.join(self.bin_dir, "pg_ctl"), "-D", self.data, "-m", mode, "-w", "stop", check=False)

    def create_db(self, name: str) -> str:
        """A fresh empty database; its URL."""
        import psycopg

        with psycopg.connect(self.host_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]  # names are the tests' own
        return self.url(name)

    def remove(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


def start_cluster() -> Cluster:
    """Initialise and start a cluster in a new temp dir; raises RuntimeError saying why not."""
    bin_dir = find_bin()
    if bin_dir is None:
        raise RuntimeError("PostgreSQL's initdb was not found (scripts/test installs Debian's postgresql)")
    root = tempfile.mkdtemp(prefix="heartbeat-pg-")
    os.chmod(root, 0o755)
    data = os.path.join(root, "data")
    socket_dir = os.path.join(root, "sock")
    os.mkdir(socket_dir)
    as_user: list[str] = []
    if os.geteuid() == 0:
        try:
            entry = pwd.getpwnam("postgres")
        except KeyError:
            entry = pwd.getpwnam("nobody")
        user = entry.pw_name
        os.chown(socket_dir, entry.pw_uid, entry.pw_gid)
        os.mkdir(data, 0o700)
        os.chown(data, entry.pw_uid, entry.pw_gid)
        os.chown(root, entry.pw_uid, entry.pw_gid)
        as_user = ["runuser", "-u", user, "--"]
    else:
        user = pwd.getpwuid(os.geteuid()).pw_name
    cluster = Cluster(bin_dir=bin_dir, root=root, data=data, socket_dir=socket_dir, user=user, as_user=as_user)
    result = cluster._run(os.path.join(bin_dir, "initdb"), "-D", data, "-U", user, "-A", "trust", "-E", "UTF8",
                          "--no-sync", "--locale=C", check=False)
    if result.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"initdb failed: {result.stdout}{result.stderr}")
    try:
        cluster.start()
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return cluster
