"""`qserve deploy ray` and the Ray settings `qserve serve --engine ray` hands its replicas (no Ray started here).

python -m pytest -q tests/unit/test_serve_deploy.py
"""

from __future__ import annotations

from dataclasses import fields

import pytest
import yaml

from qserve.cli import main
from qserve.serve.infra.config import ServeConfig, config_from_sources
from qserve.serve.infra.deploy import APP_FIELDS, PROXY_FIELDS, app_args


@pytest.fixture
def variant(tmp_path):
    d = tmp_path / "variant"
    d.mkdir()
    (d / "manifest.json").write_text("{}")  # deploy only checks that it is there; the replicas verify it
    return d


def _deploy(tmp_path, *argv: str) -> dict:
    out = tmp_path / "serve_config.yaml"
    assert main(["deploy", "ray", *argv, "--out", str(out), "--force"]) == 0
    return yaml.safe_load(out.read_text())["applications"][0]


def test_without_threads_each_replica_gets_its_share_of_the_cores(tmp_path, variant, monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    app = _deploy(tmp_path, str(variant), "--replicas", "2")
    # Ray reserves 2 CPUs a replica, and the replica runs 2 intra-op threads, not all 4 cores.
    assert app["deployments"][0]["ray_actor_options"] == {"num_cpus": 2.0}
    assert app["args"]["threads"] == 2
    assert _deploy(tmp_path, str(variant), "--replicas", "2", "--threads", "1")["args"]["threads"] == 1


def test_app_settings_reach_the_replicas_and_proxy_settings_do_not(tmp_path, variant):
    app = _deploy(
        tmp_path, str(variant), "--threads", "1", "--allow-extra-files", "--metrics-public", "--max-batch-size", "8"
    )
    assert app["args"] == {
        "variant_dir": str(variant),
        "threads": 1,
        "allow_extra_files": True,
        "metrics_public": True,
        "max_batch_size": 8,
    }
    # `qserve serve --engine ray` builds its replicas' args the same way, from the whole resolved config.
    cfg = config_from_sources(
        {
            "variant_dir": str(variant),
            "allow_extra_files": True,
            "metrics_public": True,
            "api_key": "k" * 8,
            "port": 9000,
            "max_connections": 10,
        },
        {},
    )
    args = app_args(cfg.variant_dir, vars(cfg))
    assert args["allow_extra_files"] is True and args["metrics_public"] is True
    assert not set(args) & {"api_key", "port", "host", "max_connections", "header_timeout_s"}


def test_every_serve_setting_is_either_the_apps_or_the_proxys():
    names = [f.name for f in fields(ServeConfig)]
    assert set(PROXY_FIELDS) <= set(names)  # a renamed field cannot silently slip into the replicas' args
    assert sorted(APP_FIELDS + PROXY_FIELDS) == sorted(names)
