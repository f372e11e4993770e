"""The cluster-mode drop-in (``systemd/ray-cluster.conf``) is valid with the shipped unit and opens
exactly what a Ray driver needs."""

from __future__ import annotations

from pathlib import Path

from test_systemd_unit import analyze, install_unit, needs_analyze

DROPIN = Path(__file__).resolve().parents[2] / "systemd" / "ray-cluster.conf"


def _service() -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for line in DROPIN.read_text(encoding="utf-8").splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            values.setdefault(key, []).append(value)
    return values


def test_dropin_lifts_the_private_network_and_keeps_addresses_denied() -> None:
    service = _service()
    assert service["PrivateNetwork"] == ["no"]
    assert "AF_INET" in service["RestrictAddressFamilies"][0].split()
    assert service["IPAddressDeny"] == ["any"]  # only what IPAddressAllow= names gets through
    assert "RAY_AUTH_MODE=token" in service["Environment"]
    assert service["ReadWritePaths"] == ["/srv/sharderd-shared"]


@needs_analyze
def test_verify_accepts_the_unit_with_the_cluster_dropin(tmp_path: Path) -> None:
    unit = install_unit(tmp_path)
    (tmp_path / "sharderd.service.d").mkdir()
    (tmp_path / "sharderd.service.d" / "ray-cluster.conf").write_text(
        DROPIN.read_text(encoding="utf-8")
    )
    result = analyze("verify", "--man=no", str(unit))
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
