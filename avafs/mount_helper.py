"""`mount.fuse.avafs SOURCE MOUNTPOINT [-o OPTIONS]`: the helper mount(8) runs for
`mount -t fuse.avafs` and for /etc/fstab lines of type fuse.avafs, as `avafs mount`.

An option is an `avafs mount` flag's long name with underscores, as in a config file
(`cache_dir=/var/cache/imagenet`, `read_only`, `noexec`), or `ro`, fstab's spelling of
`read_only`. mount(8) also hands the helper the options that tell it or systemd when and how to
mount (`defaults`, `noauto`, `nofail`, `_netdev`, `x-systemd.*`, ...): they mean nothing to
avafs and are dropped. Anything else is refused in one line, before anything is mounted.
"""

from __future__ import annotations

import argparse
import difflib
import sys

from .cli import OneLineParser
from .cli import main as avafs_main
from .config.options import OPTIONS_BY_NAME
from .errors import AvafsError

PROG = "mount.fuse.avafs"
FSTAB_SPELLINGS = {"ro": "read_only"}
FOR_MOUNT_ONLY = frozenset({"defaults", "auto", "noauto", "nofail", "_netdev", "user", "users",
                            "nouser", "rw", "exec", "nosuid", "nodev"})
"""Options mount(8) and systemd act on themselves (`x-` ones too, `x-systemd.automount`), and
those every avafs mount has: `rw` and `exec` unless told otherwise, `nosuid` and `nodev` always
(as every FUSE mount). mount(8) turns `user` and `users` into `noexec,nosuid,nodev`."""


def mount_flags(options: str, sloppy: bool = False) -> list[str]:
    """The `avafs mount` flags of a comma-separated `-o` list; with `sloppy` (mount -s), an
    unknown option is dropped instead of refused."""
    flags = []
    for option in filter(None, options.split(",")):
        name, has_value, value = option.partition("=")
        name = FSTAB_SPELLINGS.get(name, name)
        if name in FOR_MOUNT_ONLY or name.startswith("x-"):
            continue
        spec = OPTIONS_BY_NAME.get(name)
        if spec is None:
            if sloppy:
                continue
            near = difflib.get_close_matches(name, [*OPTIONS_BY_NAME, *FOR_MOUNT_ONLY], n=1)
            hint = f"did you mean {near[0]}?" if near else \
                "give an avafs mount flag's long name with underscores, such as cache_dir=DIR"
            raise AvafsError(f"unknown mount option {name!r}: {hint}")
        if spec.is_flag and has_value:
            raise AvafsError(f"mount option {name} takes no value: write {name}, not {option}")
        if not spec.is_flag and not has_value:
            raise AvafsError(f"mount option {name} needs a value: write {name}=...")
        flags.append(spec.flag if spec.is_flag else f"{spec.flag}={value}")
    return flags


def build_parser() -> argparse.ArgumentParser:
    """mount(8)'s helper calling convention: SOURCE MOUNTPOINT [-sfnv] [-o OPTIONS] [-t TYPE]."""
    parser = OneLineParser(prog=PROG, description="Mount SOURCE at MOUNTPOINT with avafs, as "
                           "mount -t fuse.avafs and /etc/fstab do.")
    parser.add_argument("source", metavar="SOURCE", help="s3://bucket[/prefix] or file:///dir")
    parser.add_argument("mountpoint", metavar="MOUNTPOINT")
    parser.add_argument("-o", dest="options", action="append", default=[], metavar="OPTIONS",
                        help="comma-separated avafs mount flags' long names with underscores, "
                             "NAME or NAME=VALUE")
    parser.add_argument("-s", dest="sloppy", action="store_true",
                        help="drop unknown options instead of refusing them")
    parser.add_argument("-f", dest="fake", action="store_true",
                        help="check the options, mount nothing")
    parser.add_argument("-v", dest="verbose", action="store_true",
                        help="print the avafs command run")
    parser.add_argument("-n", action="store_true", help="ignored (there is no /etc/mtab)")
    parser.add_argument("-t", dest="type", metavar="TYPE", help="ignored (fuse.avafs)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        flags = [flag for options in args.options for flag in mount_flags(options, args.sloppy)]
    except AvafsError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 1
    command = ["mount", args.source, args.mountpoint, *flags]
    if args.verbose:
        print(f"{PROG}: avafs {' '.join(command)}", file=sys.stderr)
    return 0 if args.fake else avafs_main(command)


if __name__ == "__main__":
    raise SystemExit(main())
