"""The Grafana dashboard in dashboards/ queries only what a real mount's endpoint exports, and
every exported sample says which mount (and which sources) it is about."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from support import free_port, run_avafs

from avafs.client import Client

DASHBOARD = Path(__file__).resolve().parents[2] / "dashboards" / "avafs.json"


def queries(dashboard: dict) -> list[str]:
    found = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    found += [variable["definition"] for variable in dashboard["templating"]["list"]
              if variable["type"] == "query"]
    return found


def test_every_dashboard_query_names_an_exported_metric(local_bucket, mount):
    port = free_port()
    (local_bucket / "in.bin").write_bytes(b"x" * 100_000)
    mnt = mount(local_bucket.as_uri(), "--metrics-addr", f"127.0.0.1:{port}",
                "--mount-name", "pv-data", "--writeback-delay", "3600")
    (mnt / "in.bin").read_bytes()
    (mnt / "out.bin").write_bytes(b"y" * 1000)
    assert run_avafs("flush", str(mnt)).returncode == 0
    Client(mnt).warmup([mnt])
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    exported = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            exported.add(sample.name)
            assert sample.labels["mount"] == "pv-data", sample
            assert sample.labels["source_url"] == local_bucket.as_uri(), sample

    dashboard = json.loads(DASHBOARD.read_text())
    named = {name for query in queries(dashboard) for name in re.findall(r"\bavafs_\w+", query)}
    assert len(named) >= 15
    assert named <= exported, sorted(named - exported)
    for query in queries(dashboard):
        assert "mount" in query, query
