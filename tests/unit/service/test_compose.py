"""docker-compose.yml and docker-compose.tls.yml: valid for a real compose implementation, and safe by construction.

The validity tests run ``docker compose config`` (v2 plugin) or ``docker-compose config`` (Debian's 1.29:
``apt-get install -y --no-install-recommends docker-compose``) when one is installed, and skip otherwise; neither
needs a Docker engine. The structural tests read the YAML directly and always run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from attnclust.service.security import ROLES

ROOT = Path(__file__).resolve().parents[3]
BASE = ROOT / "docker-compose.yml"
TLS = ROOT / "docker-compose.tls.yml"
DASHBOARD = 8787
SCHEDULER_PORT = 8786
GPU_RESERVATION = [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
PROFILES = {"scheduler": "gpu", "gpu-worker": "gpu", "scheduler-cpu": "cpu", "cpu-worker": "cpu",
            "client": "tools", "client-cpu": "tools"}


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def base() -> dict:
    return _load(BASE)["services"]


@pytest.fixture(scope="module")
def tls() -> dict:
    return _load(TLS)["services"]


def _compose_command() -> list[str] | None:
    """A compose implementation that can run ``config`` without an engine, or None."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True, check=False).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def _compose_config(*files: Path) -> dict:
    cmd = _compose_command()
    if cmd is None:
        pytest.skip("no compose implementation on PATH; install one with "
                    "'apt-get install -y --no-install-recommends docker-compose'")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_MODEL", "BAKE_RESNET", "CPU_WORKERS")}
    args = [*cmd, "--project-directory", str(ROOT)]
    for f in files:
        args += ["-f", str(f)]
    proc = subprocess.run([*args, "config"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60,
                          check=False)
    assert proc.returncode == 0, f"{' '.join(args)} config failed:\n{proc.stderr}"
    return yaml.safe_load(proc.stdout)["services"]


def _ports(service: dict) -> list[tuple[str | None, int | None, int]]:
    """(host_ip, published, target) of every published port, in short or long syntax."""
    out = []
    for p in service.get("ports", []):
        if isinstance(p, dict):
            published = p.get("published")
            out.append((p.get("host_ip"), int(published) if published is not None else None, int(p["target"])))
            continue
        spec = str(p).split("/")[0]
        parts = spec.rsplit(":", 2)
        if len(parts) == 3:
            out.append((parts[0], int(parts[1]), int(parts[2])))
        elif len(parts) == 2:
            out.append((None, int(parts[0]), int(parts[1])))
        else:
            out.append((None, None, int(parts[0])))
    return out


def _mount_targets(service: dict) -> set[str]:
    """Container paths of the mounts, in short ("src:dst[:mode]") or long syntax."""
    return {v["target"] if isinstance(v, dict) else v.split(":")[1] for v in service.get("volumes", [])}


def _command(service: dict) -> list[str]:
    cmd = service["command"]
    return cmd.split() if isinstance(cmd, str) else [str(c) for c in cmd]


# -- a real compose implementation accepts the files ----------------------------------------------------------

def test_compose_file_is_valid():
    services = _compose_config(BASE)
    assert set(services) == set(PROFILES)
    _check_published_ports(services)


def test_compose_with_tls_override_is_valid():
    services = _compose_config(BASE, TLS)
    assert set(services) == set(PROFILES)
    _check_published_ports(services)
    for name, svc in services.items():
        assert "tcp://" not in " ".join(_command(svc)), f"{name}: still on tcp:// with the TLS override"
        assert str(svc["environment"]["DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION"]) == "True", name
        assert "/certs" in _mount_targets(svc), f"{name}: ./certs not mounted"
        # the override adds to the base file's mounts instead of replacing them
        assert {"/data", "/runs", "/models/local"} <= _mount_targets(svc), name


# -- structure: what is exposed, GPU, health, profiles ---------------------------------------------------------

def _check_published_ports(services: dict) -> None:
    for name, svc in services.items():
        assert svc.get("network_mode") != "host", f"{name}: host networking would expose the scheduler port"
        for host_ip, published, target in _ports(svc):
            assert target == DASHBOARD, f"{name}: publishes container port {target}; only the dashboard may be"
            assert published == DASHBOARD, f"{name}: dashboard published on host port {published}"
            assert host_ip == "127.0.0.1", f"{name}: dashboard published on {host_ip or 'all interfaces'}"


def test_only_the_dashboard_is_published_on_loopback(base):
    _check_published_ports(base)
    published = {name for name, svc in base.items() if svc.get("ports")}
    assert published == {"scheduler", "scheduler-cpu"}
    assert not any(svc.get("expose") for svc in base.values())


def test_scheduler_commands_and_healthcheck(base):
    for name in ("scheduler", "scheduler-cpu"):
        svc = base[name]
        cmd = _command(svc)
        assert cmd[:2] == ["dask", "scheduler"], name
        assert cmd[cmd.index("--host") + 1] == "0.0.0.0"
        assert cmd[cmd.index("--port") + 1] == str(SCHEDULER_PORT)
        assert cmd[cmd.index("--dashboard-address") + 1] == f":{DASHBOARD}"
        test = " ".join(svc["healthcheck"]["test"])
        assert f"localhost:{DASHBOARD}/health" in test, name
    assert base["scheduler-cpu"]["networks"]["default"]["aliases"] == ["scheduler"]


def test_gpu_worker_reserves_gpus_and_shares_the_device(base):
    svc = base["gpu-worker"]
    assert svc["deploy"]["resources"]["reservations"]["devices"] == GPU_RESERVATION
    assert str(svc["shm_size"]).lower() in ("8gb", "8g")
    cmd = _command(svc)
    assert cmd[:4] == ["dask", "cuda", "worker", f"tcp://scheduler:{SCHEDULER_PORT}"]
    assert "--rmm-pool-size" not in cmd, "an RMM pool would take the memory torch needs"
    assert 0 < float(cmd[cmd.index("--device-memory-limit") + 1]) <= 0.5
    assert svc["depends_on"]["scheduler"]["condition"] == "service_healthy"
    assert svc["build"]["dockerfile"] == "docker/Dockerfile"


def test_cpu_profile_has_no_gpu(base):
    svc = base["cpu-worker"]
    assert "deploy" not in svc
    assert _command(svc)[:3] == ["dask", "worker", f"tcp://scheduler:{SCHEDULER_PORT}"]
    assert svc["depends_on"]["scheduler-cpu"]["condition"] == "service_healthy"
    for name in ("scheduler-cpu", "cpu-worker", "client-cpu"):
        assert base[name]["build"]["dockerfile"] == "docker/Dockerfile.cpu", name
        assert "deploy" not in base[name], name


def test_workers_start_with_attnclusts_mmap_threshold(base):
    """The nanny's own MALLOC_TRIM_THRESHOLD_ would otherwise pin glibc's 128 KiB mmap threshold
    (runtime.malloc_environ)."""
    from attnclust.runtime import MALLOC_MMAP_THRESHOLD

    for name in ("gpu-worker", "cpu-worker"):
        assert str(base[name]["environment"]["MALLOC_MMAP_THRESHOLD_"]) == str(MALLOC_MMAP_THRESHOLD), name


def test_every_service_is_in_one_profile(base):
    # no service starts without a profile: `--profile cpu` on a laptop never starts a GPU worker
    assert {name: svc.get("profiles") for name, svc in base.items()} == {n: [p] for n, p in PROFILES.items()}


def test_mounts(base):
    for name, svc in base.items():
        vols = {v.split(":")[1]: v for v in svc["volumes"]}
        assert vols["/data"] == "./data:/data:ro", name
        assert vols["/runs"] == "./runs:/runs", name
        # not over /models: weights baked into the image under /models/hf and /models/torch stay visible
        assert vols["/models/local"] == "./models:/models/local", name


def test_build_args_reach_both_images(base):
    for name in ("scheduler", "scheduler-cpu"):
        assert set(base[name]["build"]["args"]) == {"HF_MODEL", "BAKE_RESNET"}, name


# -- TLS override ----------------------------------------------------------------------------------------------

def test_tls_override_covers_every_service(base, tls):
    assert set(tls) == set(base)
    cert_files = {"ca.pem"} | {f"{r}.pem" for r in ROLES} | {f"{r}-key.pem" for r in ROLES}
    for name, svc in tls.items():
        assert svc["volumes"] == ["./certs:/certs:ro"], name
        env = svc["environment"]
        assert env["DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION"] == "True", name
        assert env["DASK_SCHEDULER_ADDRESS"] == f"tls://scheduler:{SCHEDULER_PORT}", name
        used = re.findall(r"/certs/([\w.-]+)", yaml.safe_dump(svc))
        assert set(used) <= cert_files, f"{name}: {set(used) - cert_files} is not written by 'attnclust certs'"


def _tls_flags(cmd: list[str]) -> dict[str, str]:
    return {flag: cmd[cmd.index(flag) + 1] for flag in ("--tls-ca-file", "--tls-cert", "--tls-key")}


def test_tls_commands_are_the_base_commands_over_tls(base, tls):
    """The override restates commands (compose replaces them whole): they must not drift from the base file."""
    roles = {"scheduler": "scheduler", "scheduler-cpu": "scheduler", "gpu-worker": "worker", "cpu-worker": "worker"}
    for name, role in roles.items():
        cmd = _command(tls[name])
        assert _tls_flags(cmd) == {"--tls-ca-file": "/certs/ca.pem", "--tls-cert": f"/certs/{role}.pem",
                                   "--tls-key": f"/certs/{role}-key.pem"}, name
        stripped = [c for i, c in enumerate(cmd) if not (c.startswith("--tls-") or
                                                         (i and cmd[i - 1].startswith("--tls-")))]
        expected = [c.replace("tcp://", "tls://") for c in _command(base[name])]
        if role == "scheduler":
            assert cmd[cmd.index("--protocol") + 1] == "tls"
            stripped = [c for i, c in enumerate(stripped) if c != "--protocol" and stripped[i - 1] != "--protocol"]
        assert stripped == expected, f"{name}: TLS command differs from the base command beyond TLS"
    for name in ("client", "client-cpu"):
        env = tls[name]["environment"]
        assert env["DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT"] == "/certs/client.pem"
        assert env["DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY"] == "/certs/client-key.pem"


# -- images ----------------------------------------------------------------------------------------------------

def test_images_pin_dask_like_the_project():
    pins = dict(re.findall(r'"(dask|distributed)(?:\[\w+\])?==([\w.]+)"', (ROOT / "pyproject.toml").read_text()))
    constraints = dict(re.findall(r"^(dask|distributed)==([\w.]+)$", (ROOT / "docker" / "constraints.txt").read_text(),
                                  re.MULTILINE))
    assert pins and constraints == pins


@pytest.mark.parametrize("dockerfile,base_image", [("Dockerfile", "rapidsai/base:26.10-cuda13-py3.11"),
                                                   ("Dockerfile.cpu", "python:3.11-slim")])
def test_dockerfiles(dockerfile, base_image):
    text = (ROOT / "docker" / dockerfile).read_text()
    assert base_image in text
    users = re.findall(r"^USER\s+(\S+)", text, re.MULTILINE)
    assert users and users[-1] not in ("root", "0"), "the image must end as a non-root user"
    for needed in ("ARG HF_MODEL", "ARG BAKE_RESNET", "HF_HOME=/models/hf", "TORCH_HOME=/models/torch",
                   "ENV HF_HUB_OFFLINE=${HF_MODEL:+1}", "torch==2.14.1", "torchvision==0.29.1", '"/src[service]"',
                   "prometheus_client", "PIP_CONSTRAINT=/etc/attnclust/constraints.txt"):
        assert needed in text, f"docker/{dockerfile}: missing {needed!r}"
    if dockerfile == "Dockerfile.cpu":
        assert "--index-url https://download.pytorch.org/whl/cpu" in text
    assert (ROOT / "docker" / f"{dockerfile}.dockerignore").read_text().startswith("#")
