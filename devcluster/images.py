"""Container images for the real test node, made without a registry or a Docker engine.

``node_test_images()`` builds ``images/node-test`` (one static Go binary, see its main.go) into the
cache and packs it as two single-file images, written as docker-archive tarballs — the format
``ctr images import`` reads: ``manifest.json``, an image config whose ``rootfs.diff_ids`` are the
sha256 of each uncompressed layer tar, and the layers:

- ``registry.local/pause:gpusched`` — the kubelet's pod sandbox (containerd ``sandbox_image``);
- ``registry.local/envdump:gpusched`` — prints its environment, then sleeps.

Both are cached by the content of the Go sources; pods use them with ``imagePullPolicy: Never``.
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


def docker_archive(path: Path, tag: str, files: dict[str, tuple[bytes, int]], entrypoint: list[str]) -> Path:
    """Write a one-layer docker-archive image holding ``files`` (path -> (content, mode))."""
    layer = _tar_bytes(files)
    layer_id = hashlib.sha256(layer).hexdigest()
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": ["PATH=/"], "WorkingDir": "/"},
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
