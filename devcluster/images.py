"""Container images for the real test node, made without a registry or a Docker engine.

``node_test_images()`` builds ``images/node-test`` (one static Go binary, see its main.go) into the
cache and packs it as two single-file images, written as docker-archive tarballs — the format
``ctr images import`` reads: ``manifest.json``, an image config whose ``rootfs.diff_ids`` are the
sha256 of each uncompressed layer tar, and the layers:

- ``registry.local/pause:gpusched`` — the kubelet's pod sandbox (containerd ``sandbox_image``);
- ``registry.local/envdump:gpusched`` — prints its environment, then sleeps.

Both are cached by the content of the Go sources; pods use them with ``imagePullPolicy: Never``.

``project_images()`` returns the images the shipped manifests name, for the install tests:
``ghcr.io/gpusched/extender``, ``node-agent`` and ``scheduler-plugin`` (plugin mode's GpuSched
kube-scheduler) built from their Dockerfiles, unchanged, by ``hack/build-images.sh`` (buildah on
local stand-ins for the Python and Go base images), and
``registry.k8s.io/kube-scheduler`` and ``quay.io/brancz/kube-rbac-proxy`` as single static
binaries (our pinned kube-scheduler build; kube-rbac-proxy from the Go module proxy at the tag the
Deployment names, ``hack/build-tools.sh``), at the paths their real images use.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "images" / "node-test"
PAUSE_IMAGE = "registry.local/pause:gpusched"
ENVDUMP_IMAGE = "registry.local/envdump:gpusched"


class ImageBuildFailed(RuntimeError):
    pass


@dataclass(frozen=True)
class ImageArchive:
    tag: str
    path: Path


def _cache_dir() -> Path:
    root = os.environ.get("GPUSCHED_IMAGE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "gpusched", "images")
    return Path(root)


def _source_digest() -> str:
    h = hashlib.sha256()
    for f in sorted(SOURCE.glob("*")):
        if f.is_file():
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def build_node_test_binary() -> Path:
    """``images/node-test`` as a static binary, cached by its sources' digest."""
    out = _cache_dir() / f"nodetest-{_source_digest()}"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GOTOOLCHAIN": "local", "CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false"}
    proc = subprocess.run(["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(out) + ".tmp", "."],
                          cwd=SOURCE, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ImageBuildFailed(f"go build of {SOURCE} failed:\n{proc.stderr}")
    os.replace(str(out) + ".tmp", out)
    return out


def _tar_bytes(members: dict[str, tuple[bytes, int]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, (data, mode) in sorted(members.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def docker_archive(path: Path, tag: str, files: dict[str, tuple[bytes, int]], entrypoint: list[str] | None,
                   *, env_path: str = "/", user: str = "") -> Path:
    """Write a one-layer docker-archive image holding ``files`` (path -> (content, mode))."""
    layer = _tar_bytes(files)
    layer_id = hashlib.sha256(layer).hexdigest()
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": [f"PATH={env_path}"], "WorkingDir": "/",
                   **({"User": user} if user else {})},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_id}"]},
        "history": [{"created_by": "devcluster.images (gpusched test harness)"}],
    }, sort_keys=True).encode()
    config_id = hashlib.sha256(config).hexdigest()
    manifest = json.dumps([{"Config": f"{config_id}.json", "RepoTags": [tag],
                            "Layers": [f"{layer_id}/layer.tar"]}]).encode()
    archive = _tar_bytes({"manifest.json": (manifest, 0o644), f"{config_id}.json": (config, 0o644),
                          f"{layer_id}/layer.tar": (layer, 0o644)})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(archive)
    os.replace(tmp, path)
    return path


def node_test_images() -> list[ImageArchive]:
    """The pause and envdump image archives (built and cached on first use)."""
    binary = build_node_test_binary()
    data = binary.read_bytes()
    digest = binary.name.split("-", 1)[1]
    out = []
    for tag, name in ((PAUSE_IMAGE, "pause"), (ENVDUMP_IMAGE, "envdump")):
        path = _cache_dir() / f"{name}-{digest}.tar"
        if not path.is_file():
            docker_archive(path, tag, {name: (data, 0o755)}, [f"/{name}"])
        out.append(ImageArchive(tag, path))
    return out


KUBE_SCHEDULER_IMAGE = "registry.k8s.io/kube-scheduler:{version}"
KUBE_RBAC_PROXY_IMAGE = "quay.io/brancz/kube-rbac-proxy:{version}"


def _versions() -> dict[str, str]:
    out = {}
    for line in (REPO / "hack" / "versions.env").read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.startswith("#"):
            out[key.strip()] = value.strip()
    return out


def _script_lines(*argv: str) -> list[str]:
    proc = subprocess.run(["bash", *argv], cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ImageBuildFailed(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return [line for line in proc.stdout.splitlines() if line.strip()]


def _static_image(tag: str, binary: Path, name: str, *, entrypoint: bool, user: str = "") -> ImageArchive:
    """``binary`` at /usr/local/bin/<name> (where the real image has it); cached by its size and mtime."""
    stat = binary.stat()
    key = hashlib.sha256(f"{tag} {binary} {stat.st_size} {stat.st_mtime_ns} v1".encode()).hexdigest()[:16]
    path = _cache_dir() / f"{name}-{key}.tar"
    if not path.is_file():
        docker_archive(path, tag, {f"usr/local/bin/{name}": (binary.read_bytes(), 0o755)},
                       [f"/usr/local/bin/{name}"] if entrypoint else None, env_path="/usr/local/bin", user=user)
    return ImageArchive(tag, path)


def project_images(bin_dir: Path) -> list[ImageArchive]:
    """Every image ``manifests/base`` and its overlays name, under the tags they name (built and
    cached on first use). ``bin_dir``: the control-plane build (kube-scheduler). Fails with the
    builder's output."""
    versions = _versions()
    images = []
    tags = {"extender": "ghcr.io/gpusched/extender:0.1.0", "node-agent": "ghcr.io/gpusched/node-agent:0.1.0",
            "scheduler-plugin": "ghcr.io/gpusched/scheduler-plugin:0.1.0"}
    for line in _script_lines("hack/build-images.sh", *tags):
        name, _, archive = line.partition(" ")
        images.append(ImageArchive(tags[name], Path(archive)))
    # The Deployment runs `command: [kube-scheduler, ...]`: on PATH, as in registry.k8s.io's image.
    images.append(_static_image(KUBE_SCHEDULER_IMAGE.format(version=versions["KUBERNETES_VERSION"]),
                                bin_dir / "kube-scheduler", "kube-scheduler", entrypoint=False))
    from devcluster.render import tool

    proxy = tool("kube-rbac-proxy")
    # Its own image: ENTRYPOINT /usr/local/bin/kube-rbac-proxy, USER 65532:65532.
    images.append(_static_image(KUBE_RBAC_PROXY_IMAGE.format(version=versions["KUBE_RBAC_PROXY_VERSION"]),
                                proxy, "kube-rbac-proxy", entrypoint=True, user="65532:65532"))
    return images
