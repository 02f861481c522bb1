#!/usr/bin/env python3
"""The crash loop of the reliability suite: random file work on an s3:// mount, `kill -9` of
the daemon at a random moment, remount, check; then flush and check the bucket.

Each cycle mounts (with a random write-back delay, so uploads are in flight when the kill
lands), checks every file the model knows through the mount, then runs random operations until
the daemon is killed: whole-file writes, appends, truncates, file renames (also over an existing
file), directory renames (also while a file in the directory is being written), and unlinks of
open files that go on being written and read through their descriptor. Every operation is
fsync'ed before it counts as acknowledged, and read back through the mount once it returned.
The operation the kill interrupted may end either way: the next mount must show one of its
allowed outcomes (the old state, or the new one, of which a write may have landed any prefix).

At the end a last mount is flushed and the bucket must hold exactly the model: every
acknowledged byte, nothing deleted, no data of a file unlinked while open, and no unfinished
multipart upload. Prints the figures; exits 1 with the violations if there is any.

    python3 -m bench.soak.crash_loop --cycles 50
    python3 -m bench.soak.crash_loop --endpoint http://127.0.0.1:9000 --bucket test --cycles 3
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import boto3

from avafs.host.processes import wait_for_exit
from bench.harness import s3server
from bench.harness.common import used_workdir

MiB = 2**20
_CHUNK = 64 * 1024
_BIG = 70 * MiB
"""A big write: above the size at which files stream while written and go up in parts."""

Content = bytes | None
Matcher = Callable[[Content], bool]


def exactly(expected: Content) -> Matcher:
    return lambda found: found == expected


def prefix_of(data: bytes, before: Content = None, at_least: int = 0) -> Matcher:
    """What an interrupted write may leave: the state before it, or any prefix of its data
    that is at least `at_least` long (the writes before the kill all reach the data file)."""
    return lambda found: found == before or (
        found is not None and len(found) >= at_least and data.startswith(found))


@dataclass
class Interrupted:
    """An operation the kill cut short: its allowed outcomes, one {path: matcher} each."""

    name: str
    outcomes: list[dict[str, Matcher]]


@dataclass
class Figures:
    cycles: int = 0
    kills: int = 0
    operations: int = 0
    interrupted: int = 0
    open_unlinks: int = 0
    dir_renames: int = 0
    file_checks: int = 0
    bytes_checked: int = 0
    files_at_end: int = 0
    bytes_at_end: int = 0
    open_multipart_uploads: int = 0
    violations: list[str] = field(default_factory=list)


class Model:
    """What the mount must show: path -> content, for files two levels deep (dir/file)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.files: dict[str, bytes] = {}
        self.dirs: set[str] = set()
        self._names = 0

    def new_dir(self) -> str:
        self._names += 1
        return f"d{self._names}"

    def dir_files(self, directory: str) -> dict[str, bytes]:
        return {path: data for path, data in self.files.items()
                if path.startswith(directory + "/")}

    def pick_file(self) -> str | None:
        return self.rng.choice(sorted(self.files)) if self.files else None

    def pick_path(self) -> str:
        """A path to write: often an existing file, else a new name in some directory."""
        if self.files and self.rng.random() < 0.4:
            return self.pick_file()
        if not self.dirs or self.rng.random() < 0.1:
            self.dirs.add(self.new_dir())
        return f"{self.rng.choice(sorted(self.dirs))}/f{self.rng.randrange(12)}"


class Worker:
    """Runs random operations on the mount until the daemon is gone."""

    def __init__(self, mnt: Path, model: Model, figures: Figures, rng: random.Random,
                 big: bool) -> None:
        self.mnt = mnt
        self.model = model
        self.figures = figures
        self.rng = rng
        self.big = big
        self.killed = threading.Event()
        self.interrupted: Interrupted | None = None
        self.log: Callable[[str], None] = lambda line: None

    def run(self) -> None:
        operations = [self.write, self.write, self.append, self.truncate, self.rename,
                      self.rename_dir, self.unlink_open, self.write_across_dir_rename]
        while not self.killed.is_set():
            operation = self.rng.choice(operations)
            try:
                operation()
            except OSError as error:
                if not self.killed.is_set() or error.errno not in (
                        errno.ENOTCONN, errno.ECONNABORTED, errno.EIO):
                    self.figures.violations.append(
                        f"{operation.__name__} failed while the daemon ran: {error!r}")
                return
            self.figures.operations += 1

    def _payload(self, size: int) -> bytes:
        return self.rng.randbytes(size)

    def _size(self) -> int:
        if self.big:
            self.big = False
            return _BIG
        return self.rng.choice((0, 1, 100, 4096, 70_000, 300_000, 2 * MiB + 5))

    def _cut(self, name: str, outcomes: list[dict[str, Matcher]], *paths: str) -> None:
        """Declare what the next steps may leave if the kill cuts them short."""
        self.interrupted = Interrupted(name, outcomes)
        self.log(f"{name} {' '.join(paths)}")

    def _done(self, changes: dict[str, Content]) -> None:
        self.interrupted = None
        for path, data in changes.items():
            if data is None:
                self.model.files.pop(path, None)
            else:
                self.model.files[path] = data
        for path, data in changes.items():
            self._check(path, data)

    def _check(self, path: str, expected: Content) -> None:
        found = read(self.mnt / path)
        self.figures.file_checks += 1
        self.figures.bytes_checked += len(found or b"")
        if found != expected:
            self.figures.violations.append(
                f"{path}: read back {describe(found)} right after it was acknowledged as "
                f"{describe(expected)}")

    def _write_file(self, path: str, data: bytes, flags: int) -> None:
        fd = os.open(self.mnt / path, os.O_WRONLY | flags, 0o644)
        try:
            for offset in range(0, len(data), _CHUNK):
                os.write(fd, data[offset:offset + _CHUNK])
            os.fsync(fd)
        finally:
            os.close(fd)

    def write(self) -> None:
        path = self.model.pick_path()
        before, data = self.model.files.get(path), self._payload(self._size())
        self._cut("write", [{path: prefix_of(data, before)}], path, str(len(data)))
        os.makedirs(self.mnt / path.split("/")[0], exist_ok=True)
        self._write_file(path, data, os.O_CREAT | os.O_TRUNC)
        self._done({path: data})

    def append(self) -> None:
        path = self.model.pick_file()
        if path is None:
            return
        before = self.model.files[path]
        after = before + self._payload(self.rng.choice((1, 1000, 100_000)))
        self._cut("append", [{path: prefix_of(after, before, len(before))}], path, str(len(after)))
        self._write_file(path, after[len(before):], os.O_APPEND)
        self._done({path: after})

    def truncate(self) -> None:
        path = self.model.pick_file()
        if path is None:
            return
        before = self.model.files[path]
        size = self.rng.randrange(0, len(before) + 10_000)
        after = before[:size] + b"\0" * max(0, size - len(before))
        self._cut("truncate", [{path: exactly(before)}, {path: exactly(after)}], path, str(size))
        with open(self.mnt / path, "r+b") as file:
            file.truncate(size)
            file.flush()
            os.fsync(file.fileno())
        self._done({path: after})

    def rename(self) -> None:
        """A file to a new name, or over another file (the atomic-replace pattern)."""
        old = self.model.pick_file()
        if old is None:
            return
        new = self.model.pick_path()
        if new == old:
            return
        data, replaced = self.model.files[old], self.model.files.get(new)
        os.makedirs(self.mnt / new.split("/")[0], exist_ok=True)
        self._cut("rename", [{old: exactly(data), new: exactly(replaced)},
                             {old: exactly(None), new: exactly(data)}], old, new)
        os.rename(self.mnt / old, self.mnt / new)
        self._done({old: None, new: data})

    def _dir_rename_outcomes(self, old: str, new: str,
                             special: dict[str, Matcher]) -> list[dict[str, Matcher]]:
        """Either every file under `old` stays, or every one is under `new` (one journal
        batch); `special` matches a file being written meanwhile, by its name in the dir."""
        files = {path.split("/", 1)[1]: data for path, data in self.model.dir_files(old).items()}
        names = set(files) | set(special)
        outcomes = []
        for there, gone in ((old, new), (new, old)):
            outcome = {}
            for name in names:
                outcome[f"{there}/{name}"] = special.get(name) or exactly(files[name])
                outcome[f"{gone}/{name}"] = exactly(None)
            outcomes.append(outcome)
        return outcomes

    def _move_dir(self, old: str, new: str) -> dict[str, Content]:
        changes: dict[str, Content] = {}
        for path, data in self.model.dir_files(old).items():
            changes[path] = None
            changes[f"{new}/{path.split('/', 1)[1]}"] = data
        self.model.dirs.discard(old)
        self.model.dirs.add(new)
        return changes

    def rename_dir(self) -> None:
        if not self.model.dirs:
            return
        old, new = self.rng.choice(sorted(self.model.dirs)), self.model.new_dir()
        os.makedirs(self.mnt / old, exist_ok=True)  # picked for a file that was never made
        self._cut("rename_dir", self._dir_rename_outcomes(old, new, {}), old, new)
        os.rename(self.mnt / old, self.mnt / new)
        self.figures.dir_renames += 1
        self._done(self._move_dir(old, new))

    def write_across_dir_rename(self) -> None:
        """Write a file, rename its directory, go on writing through the same descriptor."""
        path = self.model.pick_path()
        directory, name = path.split("/")
        before = self.model.files.get(path)
        first, second = self._payload(self._size()), self._payload(self.rng.choice((1, 5000)))
        new = self.model.new_dir()
        self._cut("write_across_dir_rename", self._dir_rename_outcomes(
            directory, new, {name: prefix_of(first + second, before)}), path, new)
        os.makedirs(self.mnt / directory, exist_ok=True)
        fd = os.open(self.mnt / path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, first)
            os.rename(self.mnt / directory, self.mnt / new)
            os.write(fd, second)
            os.fsync(fd)
        finally:
            os.close(fd)
        self.figures.dir_renames += 1
        changes = self._move_dir(directory, new)
        changes[f"{new}/{name}"] = first + second
        self._done(changes)

    def unlink_open(self) -> None:
        """Unlink a file held open, write on through the descriptor, read it all back."""
        path = self.model.pick_file()
        if path is None:
            return
        before = self.model.files[path]
        extra = self._payload(self.rng.choice((1, 4096, 200_000)))
        self._cut("unlink_open", [{path: exactly(before)}, {path: exactly(None)}], path)
        fd = os.open(self.mnt / path, os.O_RDWR | os.O_APPEND)
        try:
            os.unlink(self.mnt / path)
            os.write(fd, extra)
            os.fsync(fd)
            found = os.pread(fd, len(before) + len(extra) + 1, 0)
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        self.figures.open_unlinks += 1
        self.figures.file_checks += 1
        self.figures.bytes_checked += len(found)
        if found != before + extra or size != len(found):
            self.figures.violations.append(
                f"{path}: unlinked while open, read back {describe(found)} (size {size}) "
                f"through its descriptor, expected {describe(before + extra)}")
        self._done({path: None})


def read(path: Path) -> Content:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def describe(data: Content) -> str:
    return "nothing" if data is None else f"{len(data)} bytes"


class CrashLoop:
    def __init__(self, endpoint: str, bucket: str, workdir: Path, seed: int,
                 kill_within: float = 2.0) -> None:
        """The kill of each cycle lands at a random moment up to `kill_within` seconds after
        its work began."""
        self.endpoint = endpoint
        self.kill_within = kill_within
        self.bucket = bucket
        self.mnt = workdir / "mnt"
        self.cache = workdir / "cache"
        self.mnt.mkdir(parents=True, exist_ok=True)
        self.rng = random.Random(seed)
        self.model = Model(self.rng)
        self.figures = Figures()
        self.interrupted: Interrupted | None = None
        """The operation the last kill cut short, checked at the next mount."""
        self.killed = 0
        self._log = open(workdir / "operations.log", "a")  # noqa: SIM115 - the loop's log

    def log(self, line: str) -> None:
        """The operations started, in order, for reading a violation back."""
        self._log.write(line + "\n")
        self._log.flush()

    def _mount(self, delay: float) -> int:
        result = subprocess.run(
            [sys.executable, "-m", "avafs", "mount", f"s3://{self.bucket}", str(self.mnt),
             "--endpoint-url", self.endpoint, "--cache-dir", str(self.cache),
             "--writeback-delay", str(delay)], capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"avafs mount failed: {result.stderr.strip()}")
        return int(os.getxattr(self.mnt, "user.avafs.pid"))

    def detach(self) -> None:
        subprocess.run(["fusermount3", "-u", "-z", str(self.mnt)], capture_output=True)

    def cycle(self, big: bool) -> None:
        pid = self._mount(self.rng.choice((0.0, 0.2, 1.0)))
        try:
            self.verify("after remount")
            worker = Worker(self.mnt, self.model, self.figures, self.rng, big)
            worker.log = self.log
            self.log(f"cycle {self.figures.cycles}: daemon {pid}, "
                     f"{len(self.figures.violations)} violations so far")

            def kill() -> None:
                worker.killed.set()
                os.kill(pid, 9)

            killer = threading.Timer(self.rng.uniform(0.1, self.kill_within), kill)
            killer.start()
            worker.run()
            killer.join()
            wait_for_exit(pid, 60)
            self.figures.kills += 1
        finally:
            self.detach()
        self.interrupted = worker.interrupted
        self.killed = pid
        self.figures.interrupted += self.interrupted is not None
        self.figures.cycles += 1

    def _resolve(self) -> None:
        """Check the operation the last kill cut short, and take what the mount shows."""
        interrupted, pid = self.interrupted, self.killed
        if interrupted is None:
            return
        self.interrupted = None
        found = {path: read(self.mnt / path)
                 for path in {path for outcome in interrupted.outcomes for path in outcome}}
        self.log(f"resolve {interrupted.name}: " + ", ".join(
            f"{path} {describe(data)}" for path, data in sorted(found.items())))
        self.figures.file_checks += len(found)
        self.figures.bytes_checked += sum(len(data or b"") for data in found.values())
        if not any(all(match(found[path]) for path, match in outcome.items())
                   for outcome in interrupted.outcomes):
            shown = ", ".join(f"{path}: {describe(data)}" for path, data in sorted(found.items()))
            self.figures.violations.append(
                f"{interrupted.name} cut short by the kill of {pid} left {shown}, which is "
                "none of its allowed outcomes")
        for path, data in found.items():
            if data is None:
                self.model.files.pop(path, None)
            else:
                self.model.files[path] = data
                self.model.dirs.add(path.split("/")[0])

    def _unmount(self, pid: int) -> None:
        subprocess.run([sys.executable, "-m", "avafs", "umount", "--no-flush", str(self.mnt)],
                       capture_output=True, timeout=300)
        wait_for_exit(pid, 60)
        self.detach()

    def verify(self, when: str) -> None:
        """Every file the model knows, and nothing else, in every directory it knows."""
        self._resolve()
        for directory in sorted(self.model.dirs):
            expected = {path.split("/", 1)[1] for path in self.model.dir_files(directory)}
            with contextlib.suppress(FileNotFoundError):
                listed = {entry.name for entry in os.scandir(self.mnt / directory)
                          if entry.is_file()}
                if listed != expected:
                    self.figures.violations.append(
                        f"{when}: {directory} lists {sorted(listed - expected)} it should not "
                        f"and misses {sorted(expected - listed)}")
        for path, data in sorted(self.model.files.items()):
            try:
                found = read(self.mnt / path)
            except OSError as error:
                self.figures.violations.append(f"{when}: reading {path} failed: {error!r}")
                continue
            self.figures.file_checks += 1
            self.figures.bytes_checked += len(found or b"")
            if found != data:
                self.figures.violations.append(
                    f"{when}: {path} shows {describe(found)}, acknowledged {describe(data)}")

    def finish(self) -> None:
        """Flush through a last mount, then the bucket must be the model, with no upload left
        unfinished."""
        pid = self._mount(0.2)
        try:
            self.verify("at the last mount")
            flushed = subprocess.run([sys.executable, "-m", "avafs", "flush", str(self.mnt)],
                                     capture_output=True, text=True, timeout=600)
            if flushed.returncode != 0:
                self.figures.violations.append(f"avafs flush failed: {flushed.stderr.strip()}")
        finally:
            self._unmount(pid)
        client = boto3.client("s3", endpoint_url=self.endpoint)
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket)
        keys = {entry["Key"] for page in pages for entry in page.get("Contents", ())}
        files = {key for key in keys if not key.endswith("/")}
        if files != set(self.model.files):
            self.figures.violations.append(
                f"the bucket holds {sorted(files - set(self.model.files))} it should not and "
                f"misses {sorted(set(self.model.files) - files)}")
        for path in sorted(files & set(self.model.files)):
            data = client.get_object(Bucket=self.bucket, Key=path)["Body"].read()
            self.figures.file_checks += 1
            self.figures.bytes_checked += len(data)
            if data != self.model.files[path]:
                self.figures.violations.append(
                    f"the bucket's {path} holds {describe(data)}, acknowledged "
                    f"{describe(self.model.files[path])}")
        uploads = client.list_multipart_uploads(Bucket=self.bucket).get("Uploads", [])
        self.figures.open_multipart_uploads = len(uploads)
        if uploads:
            self.figures.violations.append(
                f"{len(uploads)} multipart uploads left open: "
                f"{sorted(upload['Key'] for upload in uploads)}")
        self.figures.files_at_end = len(self.model.files)
        self.figures.bytes_at_end = sum(len(data) for data in self.model.files.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--big-every", type=int, default=10, metavar="N",
                        help="write one 70 MiB file (streamed in parts) every N cycles; 0: never")
    parser.add_argument("--kill-within", type=float, default=2.0, metavar="SECONDS",
                        help="latest moment of each cycle's kill (default 2); a loaded machine "
                        "needs more for a big write to be acknowledged before it")
    parser.add_argument("--endpoint", help="an S3 endpoint to use (default: start moto)")
    parser.add_argument("--bucket", help="with --endpoint: an existing, empty bucket")
    parser.add_argument("--workdir", type=Path, help="where the mount and cache go")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if problem := used_workdir(args.workdir):
        parser.error(problem)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="avafs-crash-loop-"))
    workdir.mkdir(parents=True, exist_ok=True)
    server = None
    if args.endpoint is None:
        os.environ.update(s3server.CREDENTIALS)
        server = s3server.MotoServer(workdir / "moto.log")
        server.client().create_bucket(Bucket="crash-loop")
        endpoint, bucket = server.endpoint, "crash-loop"
    else:
        endpoint, bucket = args.endpoint, args.bucket
    loop = CrashLoop(endpoint, bucket, workdir, args.seed, args.kill_within)
    started = time.monotonic()
    try:
        for number in range(args.cycles):
            loop.cycle(big=args.big_every > 0 and number % args.big_every == args.big_every - 1)
        loop.finish()
    finally:
        loop.detach()
        if server is not None:
            server.stop()
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    figures = loop.figures
    print(f"crash loop: {figures.cycles} cycles, {figures.kills} kills, {figures.operations} "
          f"operations acknowledged, {figures.interrupted} cut short by a kill, "
          f"{figures.dir_renames} directory renames, {figures.open_unlinks} unlinks of open "
          f"files; {figures.file_checks} file checks, {figures.bytes_checked / MiB:.1f} MiB "
          f"checked; {figures.files_at_end} files ({figures.bytes_at_end / MiB:.1f} MiB) in "
          f"the bucket at the end; {len(figures.violations)} violations, "
          f"{figures.open_multipart_uploads} multipart uploads left open "
          f"({time.monotonic() - started:.0f} s)")
    for violation in figures.violations:
        print(f"VIOLATION: {violation}")
    if args.json is not None:
        args.json.write_text(json.dumps(figures.__dict__, indent=2))
    return 1 if figures.violations else 0


if __name__ == "__main__":
    sys.exit(main())
