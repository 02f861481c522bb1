"""`avafs status` for people: the JSON document as a short report."""

from __future__ import annotations

from typing import Any

from ..config.sizes import format_size
from ..log_format import printable


def _path(status: dict[str, Any], refused: dict[str, str]) -> str:
    """A set-aside key as a path in the mount, control characters escaped."""
    return printable(f"{status['mountpoint']}/{refused['source'] + '/' if refused['source'] else ''}"
                     f"{refused['key']}")


def format_status(status: dict[str, Any]) -> str:
    lines = [f"avafs mount {status['mountpoint']} (pid {status['pid']}, up "
             f"{status['uptime_seconds']:.0f}s)"]
    for name, url in status["sources"].items():
        health = status["stores"][name]
        lines.append(f"  source {name or '/'}: {url}" + (
            "" if health["reachable"] else f" UNREACHABLE for {health['unreachable_seconds']:.0f}s"
            f" ({health['last_error']}); writes are kept locally until it answers"))
    lines.append(f"  cache dir: {status['cache_dir']}")
    for name, tier in status["tiers"].items():
        share = tier["used_bytes"] / tier["capacity_bytes"] if tier["capacity_bytes"] else 0.0
        lines.append(f"  {name:4} tier: {format_size(tier['used_bytes'])} of "
                     f"{format_size(tier['capacity_bytes'])} ({share:.0%}), {tier['files']} of "
                     f"{tier['capacity_files']} blocks, watermarks {tier['low_watermark']:.2f}/"
                     f"{tier['high_watermark']:.2f}")
    cluster = status["cluster"]
    if cluster is not None:
        errors = ", ".join(f"{kind} {count}" for kind, count in cluster["errors"].items())
        lines.append(f"  cluster tier: {cluster['url']}"
                     + ("" if cluster["reachable"] else f" UNREACHABLE ({cluster['last_error']})")
                     + f", {cluster['hits']} hits ({cluster['waits']} after waiting for another "
                     f"node), {cluster['misses']} misses, read {format_size(cluster['bytes_read'])}"
                     f", wrote {format_size(cluster['bytes_written'])} in {cluster['fills']} "
                     f"blocks, {cluster['fills_dropped']} dropped; errors: {errors}")
    ratio = status["hit_ratio"]
    in_cluster = f", cluster {status['hits']['cluster']}" if cluster is not None else ""
    lines.append(f"  hit ratio: {'n/a' if ratio is None else f'{ratio:.1%}'} (ram "
                 f"{status['hits']['ram']}, disk {status['hits']['disk']}{in_cluster}, store "
                 f"{status['misses']} blocks)")
    served = status["bytes_served"]
    from_cluster = f", cluster {format_size(served['cluster'])}" if cluster is not None else ""
    lines.append(f"  served: ram {format_size(served['ram'])}, disk "
                 f"{format_size(served['disk'])}{from_cluster}, store "
                 f"{format_size(served['store'])}")
    requests = ", ".join(f"{op} {count}" for op, count in sorted(status["store_requests"].items()))
    lines.append(f"  store requests: {requests or 'none'}")
    dirty = status["dirty"]
    lines.append(f"  dirty: {format_size(dirty['bytes'])} in {dirty['files']} files, upload "
                 f"queue {dirty['upload_queue']}")
    writes = status.get("cluster_writes")
    if writes is not None:
        durable = ("in the cluster" if writes["durable_in"] == "cluster" else
                   f"ONLY ON THIS NODE ({writes['unstaged']} files not staged"
                   + (f": {writes['last_error']}" if writes["last_error"] else "") + ")")
        lines.append(f"  cluster writes: node {writes['node']} of {writes['cluster']}, "
                     f"writes durable {durable}")
        for takeover in writes["takeovers"]:
            lines.append(f"  took over node {takeover['node']} ({takeover['outcome']}): "
                         f"{takeover['files']} changes applied, "
                         f"{format_size(takeover['bytes'])} uploaded")
    for refused in dirty["set_aside"]:
        lines.append(f"  set aside (the store refuses it; kept locally): "
                     f"{_path(status, refused)}: {refused['error']}")
    for job in status["warmups"]:
        lines.append(f"  warmup {job['id']} {job['state']}: "
                     f"{job['files_done'] + job['files_already_cached']}/{job['files_total']} "
                     f"files, {format_size(job['bytes_done'] + job['bytes_already_cached'])}/"
                     f"{format_size(job['bytes_total'])}, {job['files_failed']} failed")
    for error in status["recent_errors"][-5:]:
        lines.append(f"  recent {error['level']}: {error['message']}")
    return "\n".join(lines)
