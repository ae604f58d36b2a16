import pytest

from extender.model.catalog import CatalogError, builtin_catalog, catalog_from_configmap_data


@pytest.mark.parametrize(("name", "heads", "kv", "layers", "hidden", "context"), [
    ("meta-llama/Llama-3.1-8B-Instruct", 32, 8, 32, 4096, 131_072),
    ("meta-llama/Llama-3.1-70B-Instruct", 64, 8, 80, 8192, 131_072),
    ("meta-llama/Llama-3.3-70B-Instruct", 64, 8, 80, 8192, 131_072),
    ("meta-llama/Llama-3.1-405B-Instruct", 128, 8, 126, 16384, 131_072),
    ("Qwen/Qwen2.5-7B-Instruct", 28, 4, 28, 3584, 32_768),
    ("Qwen/Qwen2.5-14B-Instruct", 40, 8, 48, 5120, 32_768),
    ("Qwen/Qwen2.5-32B-Instruct", 40, 8, 64, 5120, 32_768),
    ("Qwen/Qwen2.5-72B-Instruct", 64, 8, 80, 8192, 32_768),
    ("Qwen/Qwen3-8B", 32, 8, 36, 4096, 40_960),
    ("Qwen/Qwen3-32B", 64, 8, 64, 5120, 40_960),
    ("Qwen/Qwen3-235B-A22B", 64, 4, 94, 4096, 40_960),
    ("mistralai/Mistral-7B-Instruct-v0.3", 32, 8, 32, 4096, 32_768),
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", 32, 8, 32, 4096, 32_768),
    ("mistralai/Mixtral-8x22B-Instruct-v0.1", 48, 8, 56, 6144, 65_536),
    ("deepseek-ai/DeepSeek-V3", 128, 128, 61, 7168, 163_840),
    ("deepseek-ai/DeepSeek-R1", 128, 128, 61, 7168, 163_840),
    ("google/gemma-2-9b-it", 16, 8, 42, 3584, 8_192),
    ("google/gemma-2-27b-it", 32, 16, 46, 4608, 8_192),
    ("google/gemma-3-27b-it", 32, 16, 62, 5376, 131_072),
], ids=lambda v: v if isinstance(v, str) else None)
def test_builtin_entries_match_config_json(name, heads, kv, layers, hidden, context) -> None:
    spec = builtin_catalog().lookup(name)
    assert spec is not None
    assert (spec.attention_heads, spec.kv_heads, spec.layers, spec.hidden_size, spec.context_length) == (
        heads, kv, layers, hidden, context)


@pytest.mark.parametrize("query", [
    "META-LLAMA/llama-3.1-70b-instruct", "meta-llama/Meta-Llama-3.1-70B-Instruct",
    "/models/Llama-3.1-70B-Instruct", "Llama-3.1-70B-Instruct", "s3://bucket/Llama-3.1-70B-Instruct/",
])
def test_lookup_is_forgiving(query: str) -> None:
    spec = builtin_catalog().lookup(query)
    assert spec is not None and spec.name == "meta-llama/Llama-3.1-70B-Instruct"


def test_lookup_misses() -> None:
    assert builtin_catalog().lookup("acme/unknown-model") is None
    assert builtin_catalog().lookup(None) is None


def test_configmap_entries_override_and_extend() -> None:
    catalog = catalog_from_configmap_data({"models.yaml": """
my-org/custom-70b:
  attentionHeads: 64
  kvHeads: 8
  aliases: [custom]
  contextLength: 65536
meta-llama/llama-3.1-8b-instruct:
  attentionHeads: 32
  kvHeads: 4
"""})
    assert catalog.lookup("custom").name == "my-org/custom-70b"
    assert catalog.lookup("custom").context_length == 65_536
    assert catalog.lookup("meta-llama/Llama-3.1-8B-Instruct").context_length is None  # replaced, not merged
    assert catalog.lookup("meta-llama/Llama-3.1-8B-Instruct").kv_heads == 4
    assert catalog.lookup("Qwen/Qwen3-8B") is not None


@pytest.mark.parametrize(("data", "message"), [
    ({"model.yaml": ""}, "model.yaml: unknown ConfigMap key"),
    ({"models.yaml": "a: [1"}, "not valid YAML"),
    ({"models.yaml": "- a"}, "must be a mapping"),
    ({"models.yaml": "m: 3"}, "models.yaml: m: must be a mapping"),
    ({"models.yaml": "m: {kvHeads: 8}"}, "models.yaml: m.attentionHeads: required"),
    ({"models.yaml": "m: {attentionHeads: 64, kvHeads: 0}"}, "m.kvHeads: must be a positive integer, got 0"),
    ({"models.yaml": "m: {attentionHeads: 64, kvHeads: 6}"}, "m.kvHeads: 6 must divide attentionHeads"),
    ({"models.yaml": "m: {attentionHeads: 64, kvHeads: 8, heads: 3}"}, "m.heads: unknown field"),
    ({"models.yaml": "m: {attentionHeads: 64, kvHeads: 8, paramsBillion: -1}"}, "m.paramsBillion"),
    ({"models.yaml": "m: {attentionHeads: 64, kvHeads: 8, contextLength: 128k}"},
     "m.contextLength: must be a positive integer, got '128k'"),
])
def test_configmap_errors_name_entry_and_field(data, message) -> None:
    with pytest.raises(CatalogError, match=message.replace("[", r"\[")):
        catalog_from_configmap_data(data)
