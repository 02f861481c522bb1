"""`avafs mount|umount|...`: the command line.

Every user error ends as one line on stderr and a non-zero exit; the mount commands return only
once the mount is usable, so the next line of a script can read from it.
"""

from __future__ import annotations

import argparse
import difflib
import json
import logging
import os
import socket
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlparse

from . import __version__
from .client import Client, dead_mount_error
from .config.cache_dir import (
    default_cache_root,
    open_log_for_append,
    prepare_cache_dir,
    remove_unused,
    unuploaded_in_shared_default,
)
from .config.durations import DURATION_HELP, positive_duration
from .config.file import load_config
from .config.options import (
    MOUNT_OPTIONS,
    OPTIONS_BY_NAME,
    MountOptions,
    build_mount_options,
    parse_option,
    size_spelling_warning,
)
from .config.sizes import UNITS_HELP, format_size
from .control.progress import FlushProgress, WarmupProgress, summary
from .control.status_text import format_status
from .errors import AvafsError
from .host.fuse_access import check_fuse
from .host.mounts import AVAFS_FSTYPE, is_dead, mount_at
from .host.processes import wait_for_exit
from .log_format import printable

_DAEMON_START_TIMEOUT = 120.0
_DAEMON_EXIT_TIMEOUT = 10.0


class OneLineParser(argparse.ArgumentParser):
    """argparse, but usage errors are one line that points to --help."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _positive_seconds(text: str) -> float:
    try:
        return positive_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _add_mount_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "mount", help="mount buckets at a directory",
        description="Mount SOURCE (s3://bucket[/prefix] or file:///dir) at MOUNTPOINT, or the "
                    "namespace of a YAML config with --config. Returns once the mount is usable.",
        epilog=f"SIZE is a number with an optional unit: {UNITS_HELP}; so 10Gi is 10*2^30 "
               "bytes and 10G is 10*10^9. rclone reads 10G as 10*2^30, so a one-letter decimal "
               "unit gets a warning: write 10Gi, or 10GB for 10*10^9. SECONDS is "
               f"{DURATION_HELP} (inf where shown).")
    parser.add_argument("targets", nargs="+", metavar="[SOURCE] MOUNTPOINT")
    parser.add_argument("--config", type=Path, metavar="FILE",
                        help="YAML file: 'namespace' maps directory names to source URLs; other "
                             "keys are the flags below with underscores")
    parser.add_argument("--foreground", action="store_true",
                        help="stay attached (for containers and supervisors), logging to stderr "
                             "as well as to the log file")
    for spec in MOUNT_OPTIONS:
        if spec.is_flag:
            parser.add_argument(spec.flag, dest=spec.name, action="store_const", const=True,
                                default=None, help=spec.help)
        else:
            parser.add_argument(spec.flag, dest=spec.name, default=None, metavar=spec.metavar,
                                help=spec.help)
    parser.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
    parser.set_defaults(run=_mount)


def _add_umount_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "umount", help="upload what was written, then unmount",
        description="Upload pending writes (with progress), then unmount. Ctrl-C during the "
                    "upload unmounts at once; what was not uploaded stays journaled in the "
                    "cache dir and is uploaded by the next mount of it.")
    parser.add_argument("mountpoint", type=Path)
    parser.add_argument("--no-flush", action="store_true",
                        help="unmount without waiting for uploads (they resume at next mount)")
    parser.set_defaults(run=_umount)

    parser = commands.add_parser("flush", help="wait until what was written is uploaded",
                                 description="Upload pending writes now and wait, with "
                                             "progress, until the store has all of them: "
                                             "everything in the mount, or what is under PATH.")
    parser.add_argument("path", type=Path, metavar="PATH",
                        help="the mountpoint, or a file or directory in the mount")
    parser.add_argument("--timeout", type=_positive_seconds, metavar="S",
                        help="give up waiting after S seconds: exit 1 and say what is left "
                             "(it keeps uploading)")
    parser.set_defaults(run=_flush)


def _add_control_parsers(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "warmup", help="load files into the cache before training",
        description="Load files (directories recursively) and manifest entries into the "
                    "cache of the mount they are in, in parallel, with progress.")
    parser.add_argument("paths", nargs="*", type=Path, metavar="PATH")
    parser.add_argument("--manifest", type=Path, metavar="FILE",
                        help='JSON Lines file of {"path": ...} (relative to the mount) or '
                             '{"url": "s3://bucket/key"} entries')
    parser.add_argument("--mount", type=Path, metavar="MOUNTPOINT",
                        help="the mount a manifest refers to (default: the one PATH or the "
                             "current directory is in)")
    parser.add_argument("--threads", type=int, default=8, help="parallel fetches (default 8)")
    parser.add_argument("--tier", choices=("disk", "ram", "cluster"), default="disk",
                        help="fill the disk tier (default), RAM as well, or only the "
                             "--cluster-cache tier shared by every node")
    parser.add_argument("--background", action="store_true",
                        help="return at once; 'avafs status' shows the progress")
    parser.add_argument("--check", action="store_true",
                        help="only say how much of it is cached (with --tier ram: in RAM), "
                             "fetching nothing (exit 0 when all of it)")
    parser.add_argument("--snapshot", metavar="NAME",
                        help="warm exactly the files snapshot NAME records, as their recorded "
                             "versions (of the source PATH or --mount is in)")
    parser.set_defaults(run=_warmup)

    parser = commands.add_parser("status", help="show cache, upload and warmup state",
                                 description="Show a mount's tiers, hit ratio, store traffic, "
                                             "dirty data, warmups and recent errors.")
    parser.add_argument("mountpoint", type=Path)
    parser.add_argument("--json", action="store_true", help="the documented JSON document")
    parser.add_argument("--watch", type=_positive_seconds, nargs="?", const=2.0, metavar="S",
                        help="show it again every S seconds (default 2) until Ctrl-C")
    parser.set_defaults(run=_status)

    parser = commands.add_parser(
        "refresh", help="show changes made in the store now",
        description="Forget the cached listings and attributes of PATH and everything under "
                    "it, so objects created, changed or deleted in the store since show now "
                    "instead of after --metadata-ttl seconds. Cached data stays: blocks are "
                    "checked by ETag.")
    parser.add_argument("path", type=Path, metavar="PATH",
                        help="a directory or file in the mount (it need not exist yet)")
    parser.set_defaults(run=_refresh)

    parser = commands.add_parser("evict", help="drop clean cached data",
                                 description="Drop the cached blocks of files (directories "
                                             "recursively). Dirty data is never dropped.")
    parser.add_argument("paths", nargs="+", type=Path, metavar="PATH")
    parser.set_defaults(run=_evict)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="avafs", description="A caching filesystem for training jobs: "
                           "object-storage buckets as one local directory tree.")
    parser.add_argument("-V", "--version", action="version", version=f"avafs {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     parser_class=OneLineParser)
    _add_mount_parser(commands)
    _add_umount_parser(commands)
    _add_control_parsers(commands)
    _add_recover_parser(commands)
    _add_snapshot_parser(commands)
    return parser


_SNAPSHOT_STORE_OPTIONS = ("endpoint_url", "region", "profile")
"""The mount options `avafs snapshot` takes for a bucket URL: how to reach its store."""


def _add_snapshot_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "snapshot", help="pin a bucket's tree as it is now, to mount it later",
        description="Record, list, delete and compare snapshots of a source: every file's "
                    "key, size, ETag and (where the bucket keeps versions) version id, in one "
                    "object under the source's .avafs-snapshots/. WHERE is a directory of a "
                    "mount (the snapshot records the tree under it, once what was written there "
                    "is uploaded) or a bucket URL (s3://bucket[/prefix], file:///dir). Mount "
                    "one with 'avafs mount SOURCE MOUNTPOINT --snapshot NAME'.")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION",
                                    parser_class=OneLineParser)
    usages = {"create": ("record the tree under WHERE as snapshot NAME", ["name"]),
              "list": ("list the snapshots with their files, size and age", []),
              "delete": ("delete snapshot NAME (the data stays)", ["name"]),
              "diff": ("files added, removed and changed from snapshot A to snapshot B",
                       ["first", "second"])}
    for action, (description, names) in usages.items():
        command = actions.add_parser(action, help=description, description=description)
        command.add_argument("where", metavar="WHERE")
        for name in names:
            command.add_argument(name, metavar={"first": "A", "second": "B"}.get(name, "NAME"))
        command.add_argument("--json", action="store_true", help="the answer as JSON")
        for name in _SNAPSHOT_STORE_OPTIONS:
            spec = OPTIONS_BY_NAME[name]
            command.add_argument(spec.flag, dest=name, metavar=spec.metavar,
                                 help=f"for a bucket URL: {spec.help}")
        command.set_defaults(run=_snapshot)


def _snapshot(args: argparse.Namespace) -> int:
    from .snapshots.actions import perform
    from .snapshots.catalog import SnapshotCatalog
    from .snapshots.text import format_answer

    request: dict[str, Any] = {"action": args.action}
    if args.action in ("create", "delete"):
        request["name"] = args.name
    if args.action == "diff":
        request["names"] = [args.first, args.second]
    if "://" in args.where:
        from .stores import open_store, use_profile

        values = {name: parse_option(name, getattr(args, name), OPTIONS_BY_NAME[name].flag)
                  for name in _SNAPSHOT_STORE_OPTIONS if getattr(args, name) is not None}
        use_profile(values.get("profile"))
        store = open_store(source_url(args.where), values.get("endpoint_url"),
                           values.get("region"))
        store.check()
        answer = perform(SnapshotCatalog(store), request)
    else:
        given = [name for name in _SNAPSHOT_STORE_OPTIONS if getattr(args, name) is not None]
        if given:
            raise AvafsError(f"{OPTIONS_BY_NAME[given[0]].flag} is for a bucket URL: a mount "
                             "reaches its store as it was mounted")
        path = Path(os.path.abspath(args.where))
        answer = Client.for_path(path).snapshot(args.action, path, **{
            name: value for name, value in request.items() if name != "action"})
    print(json.dumps(answer, indent=2, sort_keys=True) if args.json
          else format_answer(args.action, answer))
    if answer.get("not_uploaded"):
        print(f"avafs: warning: {answer['not_uploaded']} changes under {args.where} are not in "
              "the store (it refuses them; see 'avafs status'), so the snapshot does not "
              "record them", file=sys.stderr)
    return 0


_RECOVER_OPTIONS = ("cluster_cache", "cluster_endpoint_url", "cluster_profile", "cluster_timeout",
                    "etcd", "cluster_lease_ttl", "endpoint_url", "region", "profile")
"""The mount options `avafs recover` takes: where the cluster is, and how to reach origins."""


def _add_recover_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "recover", help="upload a lost node's queue of cluster writes",
        description="Upload to the origin what a node gone for good had acknowledged under "
                    "--writeback cluster and not uploaded yet, from the cluster store, as a "
                    "running daemon of the cluster would; exits when the queue is empty.")
    parser.add_argument("--node", required=True, metavar="NAME",
                        help="the lost node's --node-name")
    for name in _RECOVER_OPTIONS:
        spec = OPTIONS_BY_NAME[name]
        parser.add_argument(spec.flag, dest=name, metavar=spec.metavar, help=spec.help)
    parser.set_defaults(run=_recover)


def _recover(args: argparse.Namespace) -> int:
    from .stores import open_cluster_bucket, open_store, use_profile
    from .writeback.cluster.coordination import Etcd, EtcdUnavailable
    from .writeback.cluster.queue import ClusterQueue, cluster_id
    from .writeback.cluster.takeover import Takeover, recover

    values = {name: OPTIONS_BY_NAME[name].default for name in _RECOVER_OPTIONS}
    for name in _RECOVER_OPTIONS:
        if getattr(args, name) is not None:
            values[name] = parse_option(name, getattr(args, name), OPTIONS_BY_NAME[name].flag)
    if not values["cluster_cache"] or not values["etcd"]:
        raise AvafsError("recover needs the cluster's --cluster-cache s3://BUCKET[/prefix] and "
                         "--etcd URL[,URL...], as its mounts were given")
    use_profile(values["profile"])
    bucket = open_cluster_bucket(values["cluster_cache"], values["cluster_endpoint_url"],
                                 values["cluster_profile"], values["cluster_timeout"])
    etcd = Etcd(values["etcd"], timeout=5.0)
    queue = ClusterQueue(bucket, etcd, cluster_id(values["cluster_cache"]),
                         f"recover-{socket.gethostname()}-{os.getpid()}")
    origins: dict[str, Any] = {}

    def open_origin(url: str) -> Any:
        if url not in origins:
            origins[url] = open_store(url, values["endpoint_url"], values["region"])
        return origins[url]

    def report(progress: Takeover) -> None:
        print(f"recovering node {args.node}: {progress.files} changes applied"
              + (f" (retrying: {progress.error})" if progress.error else ""), file=sys.stderr)

    try:
        progress = recover(queue, args.node, values["cluster_lease_ttl"], open_origin, report)
    except EtcdUnavailable as error:
        raise AvafsError(f"etcd does not answer ({error}): check --etcd") from None
    finally:
        queue.close()
        etcd.close()
    print(f"node {args.node}: queue empty, {progress.files} changes applied to the origin "
          f"({progress.bytes} bytes uploaded)")
    return 0


def source_url(text: str) -> str:
    """A source URL as given, or a one-line error; a local directory written as a path or as a
    relative file:// URL gets the absolute file:/// URL to use instead."""
    parsed = urlparse(text)
    if parsed.scheme == "file" and (parsed.netloc not in ("", "localhost")
                                    or not parsed.path.startswith("/")):
        raise AvafsError(f"invalid source {text!r}: a local bucket is file:///absolute/dir "
                         f"(did you mean {Path(text[len('file://'):]).absolute().as_uri()}?)")
    if not parsed.scheme and Path(text).is_dir():
        raise AvafsError(f"invalid source {text!r}: a source is a URL (did you mean "
                         f"{Path(text).absolute().as_uri()}?)")
    return text


def mount_options_from_args(args: argparse.Namespace,
                            warnings: list[str]) -> tuple[MountOptions, Path]:
    """Options and mountpoint, every path absolute against the caller's working directory
    (the daemon runs from /); a line for each value that reads two ways goes to `warnings`."""
    if args.config:
        if len(args.targets) != 1:
            raise AvafsError("with --config give only MOUNTPOINT (sources come from the config)")
        sources, values = load_config(args.config.absolute(), warnings)
    else:
        if len(args.targets) != 2:
            raise AvafsError("give SOURCE and MOUNTPOINT, or --config FILE and MOUNTPOINT")
        sources, values = {"": args.targets[0]}, {}
    sources = {name: source_url(url) for name, url in sources.items()}
    for spec in MOUNT_OPTIONS:
        given = getattr(args, spec.name)
        if given is not None:
            values[spec.name] = parse_option(spec.name, given, spec.flag)
            warning = size_spelling_warning(spec.name, given, spec.flag)
            if warning:
                warnings.append(warning)
    options = build_mount_options(sources, values)
    from .stores import open_store, use_profile

    use_profile(options.profile)
    for url in options.sources.values():
        open_store(url, options.endpoint_url, options.region)
    return options, Path(os.path.abspath(args.targets[-1]))


def daemon_argv(args: argparse.Namespace, options: MountOptions, mountpoint: Path) -> list[str]:
    """The `avafs mount` arguments the background daemon runs with: the caller's, with every
    path made absolute and the cache dir settled, so the daemon (started from /) mounts what
    the caller named, where the caller meant."""
    argv = ["mount"]
    if args.config:
        argv += [f"--config={args.config.absolute()}"]
    else:
        argv.append(options.sources[""])
    argv.append(str(mountpoint))
    for spec in MOUNT_OPTIONS:
        given = getattr(args, spec.name)
        if spec.name in ("cache_dir", "log_file"):  # settled, absolute
            argv.append(f"{spec.flag}={getattr(options, spec.name)}")
        elif given is not None:
            argv.append(spec.flag if spec.is_flag else f"{spec.flag}={given}")
    return argv


def check_mountpoint(mountpoint: Path) -> None:
    entry = mount_at(mountpoint)
    if entry is not None:
        if is_dead(mountpoint):
            raise dead_mount_error(mountpoint)
        raise AvafsError(f"{mountpoint} is already mounted ({entry.fstype}): unmount it first")
    if not mountpoint.exists():
        raise AvafsError(f"mountpoint {mountpoint} does not exist: create it with "
                         f"'mkdir -p {mountpoint}'")
    if not mountpoint.is_dir():
        raise AvafsError(f"mountpoint {mountpoint} is not a directory")


def _mount(args: argparse.Namespace) -> int:
    warnings: list[str] = []
    options, mountpoint = mount_options_from_args(args, warnings)
    if args.ready_fd is None:  # the user's command, not the daemon it starts
        for warning in warnings:
            print(f"avafs: warning: {warning}", file=sys.stderr)
        check_mountpoint(mountpoint)
        check_fuse(options.allow_other)
        _warn_of_unuploaded_writes(options.cache_dir)
    if args.foreground or args.ready_fd is not None:
        from .daemon import serve  # imports pyfuse3, which check_fuse has vouched for

        return serve(options, mountpoint, args.ready_fd)
    return _start_daemon(options, daemon_argv(args, options, mountpoint))


def _warn_of_unuploaded_writes(cache_dir: Path) -> None:
    left = unuploaded_in_shared_default(cache_dir)
    if left:
        root = default_cache_root()
        print(f"avafs: warning: {root}, the cache dir every mount used by default before, holds "
              f"{left} files not yet uploaded: mount its sources once with --cache-dir {root} "
              "to upload them", file=sys.stderr)


def _start_daemon(options: MountOptions, argv: list[str]) -> int:
    created = prepare_cache_dir(options.cache_dir)
    try:
        log_file = open_log_for_append(options.log_file)
    except AvafsError:
        if created:
            remove_unused(options.cache_dir)
        raise
    read_end, write_end = os.pipe()
    try:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "avafs", *argv, "--ready-fd", str(write_end)],
            pass_fds=(write_end,), start_new_session=True, cwd="/",
            stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file)
    finally:
        os.close(log_file)
    os.close(write_end)
    with os.fdopen(read_end) as report:
        while (message := report.readline().strip()).startswith("warning: "):
            print(f"avafs: {message}", file=sys.stderr)
    if message == "ready":
        return 0
    log = options.log_file
    if not message:
        daemon.wait(timeout=_DAEMON_START_TIMEOUT)
        message = (f"error: the mount daemon exited ({daemon.returncode}) before the mount was "
                   f"ready; see {log}")
    print(f"avafs: {message}", file=sys.stderr)
    if created and str(log) not in message:  # the message says it all: the log is not needed
        with suppress(subprocess.TimeoutExpired):
            daemon.wait(timeout=_DAEMON_EXIT_TIMEOUT)  # done with its log and lock
        remove_unused(options.cache_dir)
    return 1


def _daemon_pid(mountpoint: Path) -> int | None:
    try:
        return int(os.getxattr(mountpoint, "user.avafs.pid"))
    except (OSError, ValueError):
        return None


def _umount(args: argparse.Namespace) -> int:
    mountpoint = Path(os.path.abspath(args.mountpoint))
    entry = mount_at(mountpoint)
    if entry is None:
        raise AvafsError(f"{mountpoint} is not mounted")
    if entry.fstype != AVAFS_FSTYPE:
        raise AvafsError(f"{mountpoint} is not an avafs mount ({entry.fstype})")
    if is_dead(mountpoint):
        subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], check=False,
                       capture_output=True)
        return 0
    pid = _daemon_pid(mountpoint)
    if not args.no_flush:
        try:
            _flush_with_progress(Client(mountpoint))
        except KeyboardInterrupt:
            print("avafs: interrupted: unmounting now; pending uploads stay journaled and "
                  "resume at the next mount with the same --cache-dir", file=sys.stderr)
    result = subprocess.run(["fusermount3", "-u", str(mountpoint)], capture_output=True,
                            text=True)
    if result.returncode != 0:
        reason = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "failed"
        raise AvafsError(f"cannot unmount {mountpoint}: {reason} (close files and leave the "
                         "directory, then retry)")
    if pid is not None and not wait_for_exit(pid, 120):
        raise AvafsError(f"unmounted {mountpoint}, but its daemon (pid {pid}) is still "
                         "finishing; see its log")
    return 0


def _client_for(paths: list[Path], mount: Path | None) -> Client:
    if mount is not None:
        return Client(mount)
    anchors = [Path(os.path.abspath(path)) for path in paths] or [Path.cwd()]
    client = Client.for_path(anchors[0])
    for anchor in anchors[1:]:
        client.relative(anchor)
    return client


def _warmup(args: argparse.Namespace) -> int:
    if args.snapshot is not None:
        if args.manifest is not None or args.check or len(args.paths) > 1:
            raise AvafsError("--snapshot warms what the snapshot records: give at most one "
                             "PATH (a directory of its source) and no --manifest or --check")
        if not args.paths and args.mount is None:
            raise AvafsError("--snapshot NAME needs the mount: give --mount MOUNTPOINT or a "
                             "PATH in it")
    elif not args.paths and args.manifest is None:
        raise AvafsError("give PATHs to warm up, or --manifest FILE")
    client = _client_for(args.paths, args.mount)
    paths = [os.path.abspath(path) for path in args.paths]
    if args.check:
        return _check(client.check(paths, args.manifest, args.tier))
    if args.background:
        state = client.warmup(paths, args.manifest, args.threads, args.tier, background=True,
                              snapshot=args.snapshot)
        print(f"warmup {state['id']} started in the background; follow it with "
              f"'avafs status {client.mountpoint}'")
        return 0
    with WarmupProgress() as progress:
        state = client.warmup(paths, args.manifest, args.threads, args.tier,
                              progress=progress.update, snapshot=args.snapshot)
        progress.update(state, final=True)
    print(summary(state))
    if state["files_skipped_for_space"]:
        print(f"avafs: warning: the set is larger than the {args.tier} tier; "
              f"{state['files_skipped_for_space']} files were not warmed", file=sys.stderr)
    for failure in state["failures"]:
        print(f"avafs: failed: {failure['path']}: {failure['error']}", file=sys.stderr)
    return 1 if state["files_failed"] or state["state"] == "failed" else 0


def _check(result: dict) -> int:
    """`warmup --check`: exits 0 only when everything named is cached."""
    share = result["bytes_cached"] / result["bytes_total"] if result["bytes_total"] else 1.0
    where = {"ram": " in RAM", "cluster": " in the cluster tier"}.get(result["tier"], "")
    print(f"cached{where}: {result['files_cached']}/{result['files_total']} files whole, "
          f"{format_size(result['bytes_cached'])} of {format_size(result['bytes_total'])} "
          f"({share:.0%})")
    for failure in result["failures"]:
        print(f"avafs: failed: {failure['path']}: {failure['error']}", file=sys.stderr)
    whole = result["files_cached"] == result["files_total"] and not result["failures"]
    return 0 if whole else 1


def _flush_with_progress(client: Client, path: Path | None = None,
                         timeout: float | None = None) -> dict:
    with FlushProgress() as progress:
        result = client.flush(progress=progress.update, path=path, timeout=timeout)
        if progress.shown or result["upload_queue"]:
            progress.update(result, final=True)
    for entry in result.get("set_aside", []):
        where = "/".join(part for part in (str(client.mountpoint), entry["source"], entry["key"])
                         if part)
        print(f"avafs: not uploaded, the store refuses it (kept locally): {printable(where)}: "
              f"{entry['error']}", file=sys.stderr)
    return result
    return result


def _flush(args: argparse.Namespace) -> int:
    path = Path(os.path.abspath(args.path))
    client = Client.for_path(path)
    result = _flush_with_progress(client, path, args.timeout)
    refused = len(result.get("set_aside", []))
    if result["upload_queue"] > refused:
        ended = "ended" if args.timeout is None else f"timed out after {args.timeout:g}s"
        raise AvafsError(f"flush of {path} {ended}: {result['upload_queue'] - refused} changes "
                         f"({format_size(result['bytes'])}) are not in the store yet; they keep "
                         "uploading")
    return 1 if refused else 0


def _refresh(args: argparse.Namespace) -> int:
    path = Path(os.path.abspath(args.path))
    Client.for_path(path).refresh(path)
    print(f"refreshed {path}: listings and attributes under it are read from the store again")
    return 0


def _status(args: argparse.Namespace) -> int:
    client = Client(args.mountpoint)
    if args.watch is None:
        status = client.status()
        print(json.dumps(status, indent=2, sort_keys=True) if args.json
              else format_status(status))
        return 0
    clear = "\x1b[H\x1b[2J" if sys.stdout.isatty() else ""
    try:
        while True:
            status = client.status()
            report = json.dumps(status) if args.json else format_status(status)
            print(f"{clear}{report}", end="\n" if clear else "\n\n", flush=True)
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0


def _evict(args: argparse.Namespace) -> int:
    client = _client_for(args.paths, None)
    result = client.evict([os.path.abspath(path) for path in args.paths])
    print(f"evicted {result['blocks']} cached blocks of {result['files']} files")
    for failure in result["failures"]:
        print(f"avafs: failed: {failure['path']}: {failure['error']}", file=sys.stderr)
    return 1 if result["failures"] else 0


PEER_FLAGS = {
    "--cache-size": "--disk-cache", "--max-cache-size": "--disk-cache",
    "--vfs-cache-max-size": "--disk-cache", "--free-space-ratio": "--high-watermark",
    "--buffer-size": "--inflight-memory", "--max-memory": "--inflight-memory",
    "--dir-cache-time": "--metadata-ttl", "--attr-timeout": "--metadata-ttl",
    "--entry-timeout": "--metadata-ttl", "--stat-cache-ttl": "--metadata-ttl",
    "--prefetch": "--read-ahead", "--max-readahead": "--read-ahead",
    "--endpoint": "--endpoint-url", "--ro": "--read-only", "--allow-root": "--allow-other",
    "--part-size": "--block-size", "--max-uploads": "--upload-concurrency",
}
"""Other mount tools' flags people type out of habit, and ours that do the same job."""


def _suggestion(command: argparse.ArgumentParser, unknown: str) -> str:
    """'; did you mean --x?' for a mistyped or another tool's flag, else ''."""
    name = unknown.split("=", 1)[0]
    known = [flag for flag in command._option_string_actions if flag.startswith("--")]
    near = [PEER_FLAGS[name]] if name in PEER_FLAGS and PEER_FLAGS[name] in known else \
        difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    return f"; did you mean {near[0]}?" if near else ""


def parse_args(argv: list[str] | None) -> Any:
    """Parse, letting `mount` take its positionals anywhere among its flags.

    argparse binds a positional run as soon as it sees it, so `mount SRC --flag v MNT` would
    leave MNT over; users write it that way, so leftover positionals join `targets`.
    """
    parser = build_parser()
    args, leftover = parser.parse_known_args(argv)
    flags = [item for item in leftover if item.startswith("-")]
    if leftover and args.command == "mount" and not flags:
        args.targets.extend(leftover)
    elif flags:
        command = next(action for action in parser._actions
                       if isinstance(action, argparse._SubParsersAction)).choices[args.command]
        command.error(f"unrecognized argument {flags[0]}{_suggestion(command, flags[0])}")
    elif leftover:
        parser.error(f"unrecognized arguments: {' '.join(leftover)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return args.run(args)
    except AvafsError as error:
        print(f"avafs: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        logging.shutdown()
