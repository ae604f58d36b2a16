"""The facts: model directory (config.json, safetensors), GPU backends (file, cpu, NVML with a
fake module), downward-API annotations."""

from __future__ import annotations

import json
import struct
from types import SimpleNamespace

import pytest

from engine_sidecar.errors import InputError
from engine_sidecar.gpus import MIB, CpuGpus, FileGpus, preset
from engine_sidecar.modelinfo import load_model_dir, safetensors_tensor_bytes
from engine_sidecar.nvml import NvmlGpus
from engine_sidecar.podinfo import MemoryShare, parse_annotations_text, pod_info, quantity_bytes
from gpusched_api.names import LEGACY_SHARE_ANNOTATION, SHARE_MEMORY_ANNOTATION, SHARE_RESOURCE
from tests.fixtures.sidecar_builders import MODELS


def write_safetensors(path, tensors: dict[str, int]) -> int:
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, size in tensors.items():
        header[name] = {"dtype": "BF16", "shape": [size // 2], "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)
    return offset


def test_safetensors_headers_give_exact_bytes(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(MODELS["meta-llama/Llama-3.1-8B-Instruct"]["config"]))
    a = write_safetensors(tmp_path / "model-00001.safetensors", {"a": 4096, "b": 2048})
    b = write_safetensors(tmp_path / "model-00002.safetensors", {"c": 1000})
    facts = load_model_dir(tmp_path)
    assert facts.weight_bytes == a + b == 7144
    assert facts.weight_source == "safetensors-headers"


def test_safetensors_index_total_size_wins(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(MODELS["meta-llama/Llama-3.1-8B-Instruct"]["config"]))
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 16060522496}, "weight_map": {}}))
    facts = load_model_dir(tmp_path)
    assert (facts.weight_bytes, facts.weight_source) == (16060522496, "safetensors-index")


def test_estimate_without_weights_matches_published_size(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(MODELS["meta-llama/Llama-3.1-8B-Instruct"]["config"]))
    facts = load_model_dir(tmp_path)
    assert facts.weight_source == "estimate"
    assert abs(facts.weight_bytes / 2 / 1e9 - 8.03) < 0.01


@pytest.mark.parametrize("content,needle", [
    (None, "not found"), ("{", "unreadable"), ('{"num_hidden_layers": 2}', "num_attention_heads")])
def test_bad_model_dir_names_file_and_field(tmp_path, content, needle):
    if content is not None:
        (tmp_path / "config.json").write_text(content)
    with pytest.raises(InputError, match=needle):
        load_model_dir(tmp_path)


def test_truncated_safetensors_is_an_input_error(tmp_path):
    (tmp_path / "x.safetensors").write_bytes(b"\1\2")
    with pytest.raises(InputError, match="not a safetensors file"):
        safetensors_tensor_bytes(tmp_path / "x.safetensors")


def test_file_backend_reads_inventory_format(tmp_path):
    doc = {"version": "gpusched.io/v1", "nvlinkIslands": [[0, 1]], "gpus": [
        {"index": 0, "uuid": "GPU-a", "product": "NVIDIA A100-SXM4-80GB", "memoryMiB": 81920, "memoryFreeMiB": 60000},
        {"index": 1, "uuid": "GPU-b", "product": "NVIDIA A100-SXM4-80GB", "memoryMiB": 81920},
        {"index": 2, "uuid": "GPU-c", "memoryMiB": 81920, "mig": {"enabled": True, "instances": [
            {"uuid": "MIG-1", "profile": "3g.40gb", "memoryMiB": 40192}]}}]}
    path = tmp_path / "gpus.yaml"
    path.write_text(json.dumps(doc))  # JSON is YAML
    g = FileGpus(str(path)).read()
    assert [x.uuid for x in g.gpus] == ["GPU-a", "GPU-b", "MIG-1"]
    assert g.gpus[0].free_bytes == 60000 * MIB and g.gpus[1].free_bytes == (81920 - 512) * MIB
    assert g.gpus[2].mig
    pair = g.select(("GPU-a", "GPU-b"))
    assert len(pair.gpus) == 2
    missing = g.select(("GPU-zz",))
    assert len(missing.gpus) == 3 and "not visible" in missing.notes[0]


def test_file_backend_errors_name_the_field(tmp_path):
    path = tmp_path / "g.json"
    path.write_text(json.dumps({"gpus": [{"uuid": "x"}]}))
    with pytest.raises(InputError, match=r"gpus\[0\]\.memoryMiB"):
        FileGpus(str(path)).read()


def test_cpu_backend_needs_a_budget():
    assert CpuGpus(1024).read().cpu_kv_bytes == 1024
    with pytest.raises(InputError):
        CpuGpus(0).read()


def test_presets():
    g = preset("h100-80gb", 2)
    assert len(g.gpus) == 2 and g.gpus[0].total_bytes == 81559 * MIB and g.nvlink
    with pytest.raises(InputError, match="unknown GPU"):
        preset("V100", 1)


class FakeNvmlError(Exception):
    pass


def fake_nvml(mig_supported: bool = False, v2: bool = True, p2p_ok: bool = True):
    calls = {"init": 0}

    def mem(h, version=None):
        if version is not None and not v2:
            raise FakeNvmlError("v2 not supported")
        return SimpleNamespace(total=80 * 1024**3, free=79 * 1024**3)

    def mig_mode(h):
        if not mig_supported:
            raise FakeNvmlError("NotSupported")
        return (0, 0)

    def init():
        calls["init"] += 1

    def nvlink_state(h, link):
        if link >= 2:
            raise FakeNvmlError("invalid link")
        return 1

    return SimpleNamespace(
        NVMLError=FakeNvmlError, nvmlMemory_v2=2, NVML_P2P_CAPS_INDEX_READ=0, NVML_P2P_STATUS_OK=0, NVML_NVLINK_MAX_LINKS=18,
        nvmlInit=init, nvmlDeviceGetCount=lambda: 2, nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3", nvmlDeviceGetUUID=lambda h: f"GPU-{h}",
        nvmlDeviceGetMemoryInfo=mem, nvmlDeviceGetMigMode=mig_mode,
        nvmlDeviceGetP2PStatus=lambda a, b, cap: 0 if p2p_ok else 4, nvmlDeviceGetNvLinkState=nvlink_state,
    ), calls


@pytest.mark.parametrize("v2", [True, False], ids=["memory-v2", "memory-v1-fallback"])
def test_nvml_backend(v2):
    nvml, calls = fake_nvml(v2=v2)
    backend = NvmlGpus(nvml)
    g = backend.read()
    backend.read()
    assert calls["init"] == 1  # initialised once
    assert [x.uuid for x in g.gpus] == ["GPU-0", "GPU-1"]
    assert g.gpus[0].name == "NVIDIA H100 80GB HBM3" and g.gpus[0].free_bytes == 79 * 1024**3
    assert not g.gpus[0].mig  # NotSupported = no MIG
    assert g.p2p is True and g.nvlink is True


def test_nvml_p2p_not_ok():
    nvml, _ = fake_nvml(p2p_ok=False)
    assert NvmlGpus(nvml).read().p2p is False


def test_downward_api_annotations():
    text = ('gpusched.io/assigned-gpus="GPU-a,GPU-b"\ngpusched.io/gpu-memory="30Gi"\n'
            'gpusched.io/metrics-port="8000"\nother="x\\"y"\n')
    ann = parse_annotations_text(text)
    assert ann["other"] == 'x"y'
    info = pod_info(ann)
    assert info.assigned_gpus == ("GPU-a", "GPU-b")
    assert info.memory_share == MemoryShare(bytes=30 * 2**30, annotation="gpusched.io/gpu-memory", text="30Gi")
    assert info.metrics_port == 8000
    assert info.notes == ()


@pytest.mark.parametrize("share,expected", [
    ("30Gi", 30 * 2**30), ("1.5Gi", 3 * 2**29), ("500M", 500 * 10**6), ("4e9", 4 * 10**9), ("1Ti", 2**40),
    (" 20Gi ", 20 * 2**30), ("1234567", 1234567), ("0.5Gi", 2**29)],
    ids=["Gi", "fractional-Gi", "decimal-M", "exponent", "Ti", "spaces", "plain-bytes", "half-Gi"])
def test_share_annotation_is_a_kubernetes_quantity(share, expected):
    got = pod_info({"gpusched.io/gpu-memory": share}).memory_share
    assert got is not None and got.bytes == expected and got.fraction is None
    assert got.describe() == f"gpusched.io/gpu-memory={share.strip()}"


@pytest.mark.parametrize("text", ["30Gi", "1.5Gi", "500M", "4e9", "0.5Ki", "7", "2.5e3", "100k"])
def test_share_bytes_agree_with_the_extender(text):
    from gpusched_api.quantity import parse_quantity_bytes

    assert quantity_bytes(text) == parse_quantity_bytes(text)


def test_share_names_agree_with_the_extender():
    # One definition now (gpusched_api.names): the sidecar reads the share under the name the
    # extender places it by, spelt as on the wire.
    info = pod_info({"gpusched.io/gpu-memory": "30Gi"})
    assert info.memory_share == MemoryShare(bytes=30 * 2**30, annotation=SHARE_MEMORY_ANNOTATION, text="30Gi")
    assert (SHARE_MEMORY_ANNOTATION, SHARE_RESOURCE) == ("gpusched.io/gpu-memory", "gpusched.io/gpu-share")


@pytest.mark.parametrize("share,expected", [
    ("20Gi", MemoryShare(bytes=20 * 2**30, annotation=LEGACY_SHARE_ANNOTATION, text="20Gi")),
    ("1", MemoryShare(fraction=1.0, annotation=LEGACY_SHARE_ANNOTATION, text="1")),
    ("500M", MemoryShare(bytes=500 * 10**6, annotation=LEGACY_SHARE_ANNOTATION, text="500M"))])
def test_older_share_annotation_still_read_with_a_rename_note(share, expected):
    info = pod_info({LEGACY_SHARE_ANNOTATION: share})
    assert info.memory_share == expected
    assert len(info.notes) == 1 and "rename it" in info.notes[0] and "gpusched.io/gpu-memory" in info.notes[0]


@pytest.mark.parametrize("ann,needle", [
    ({"gpusched.io/gpu-memory-share": "1.5"}, "a fraction must be in (0, 1]"),
    ({"gpusched.io/gpu-memory-share": "lots"}, "neither a fraction nor a quantity"),
    ({"gpusched.io/gpu-memory": "0.5"}, "not a fraction of the GPU"),
    ({"gpusched.io/gpu-memory": "30GB"}, "not a positive Kubernetes quantity"),
    ({"gpusched.io/gpu-memory": "30gi"}, "not a positive Kubernetes quantity"),
    ({"gpusched.io/gpu-memory": "0"}, "not a positive Kubernetes quantity"),
    ({"gpusched.io/gpu-memory": "-1Gi"}, "not a positive Kubernetes quantity"),
    ({"gpusched.io/gpu-memory": "30Gi", "gpusched.io/gpu-memory-share": "0.5"}, "both gpusched.io/gpu-memory and"),
    ({"gpusched.io/metrics-port": "http"}, "is not a port")],
    ids=["fraction-above-1", "not-a-number", "bare-fraction", "GB-suffix", "lowercase-gi", "zero", "negative", "both",
         "port"])
def test_bad_annotations_are_input_errors(ann, needle):
    with pytest.raises(InputError) as err:
        pod_info(ann)
    assert needle in str(err.value) and err.value.fix
