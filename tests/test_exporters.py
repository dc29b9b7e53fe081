"""transformers' exporters (`transformers.exporters`) on the model: `torch.export` (DynamoExporter) and ONNX
(OnnxExporter, run on ONNX Runtime), for the forward pass and for generation's prefill and decode steps.

The checks are those of transformers' own export tests (`ExportTesterMixin`, which every model's tests inherit through
`ModelTesterMixin`, Marian's and BART's too, and its generation variant): export with static and with dynamic shapes,
`export_for_generation` (which captures the prefill and decode calls of a real `generate()`), and the exported
programs' outputs against eager ones, every output tensor (logits, encoder states, the self- and cross-attention
caches). Here the tolerance is 1e-5 on every element (transformers allows 1e-4 and 5 % of elements off), and a dynamic
export also has to hold on shapes it was not traced with.
The ONNX tests need onnx, onnxscript and onnxruntime (the `test` extra) and are skipped without them.
"""

import copy

import pytest
import torch
from conftest import decode_one_token_at_a_time, tiny_model
from transformers.exporters import DynamoConfig, DynamoExporter, ExportedModel, OnnxConfig, OnnxExporter
from transformers.exporters.utils import decompose_for_generation, get_leaf_tensors

from vanilla_transformer import VanillaTransformerConfig

ATOL = RTOL = 1e-5
OTHER_SHAPES = [(3, 11, 4), (1, 4, 9)]  # (batch, source length, target length) unlike the traced (2, 7, 5)


def source_batch(batch: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids ending in eos; the last row is 2 tokens shorter, right-padded."""
    ids = torch.randint(3, 64, (batch, length))
    ids[:, -1] = 2
    mask = torch.ones_like(ids)
    ids[-1, length - 3] = 2
    ids[-1, length - 2 :] = 0
    mask[-1, length - 2 :] = 0
    return ids, mask


def forward_inputs(batch: int = 2, length: int = 7, target_length: int = 5) -> dict[str, torch.Tensor]:
    ids, mask = source_batch(batch, length)
    return {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": torch.randint(3, 64, (batch, target_length))}


def exporter_for(backend: str, dynamic: bool):
    """(exporter, config) of a backend; ONNX needs onnx and onnxscript to export, onnxruntime to run."""
    if backend == "onnx":
        for package in ("onnx", "onnxscript", "onnxruntime"):
            pytest.importorskip(package, reason=f"the ONNX export needs {package} (the `test` extra installs it)")
        return OnnxExporter(), OnnxConfig(dynamic=dynamic)
    return DynamoExporter(), DynamoConfig(dynamic=dynamic)


def assert_same_outputs(actual, expected) -> None:
    """Every output tensor of the exported program equals eager's (names from `get_leaf_tensors`)."""
    actual, expected = get_leaf_tensors(actual), get_leaf_tensors(expected)
    assert expected and sorted(actual) == sorted(expected)
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=RTOL)


def run_component(exported: ExportedModel, name: str, inputs: dict):
    """Run one component of an `export_for_generation` export on the kwargs it was traced with (what
    `ExportedModel.__call__` does for a single-graph export: flags such as `use_cache` are not graph inputs)."""
    runner = exported.runners[name]
    return runner(**{key: value for key, value in copy.deepcopy(inputs).items() if key in runner.metadata.kwargs})


def check_forward(backend: str, dynamic: bool) -> tuple:
    model = tiny_model()
    exporter, config = exporter_for(backend, dynamic)
    traced = forward_inputs()
    exported = exporter.export(model, copy.deepcopy(traced), config)
    for inputs in [traced] + ([forward_inputs(*shape) for shape in OTHER_SHAPES] if dynamic else []):
        with torch.no_grad():
            expected = model(**inputs)
        assert_same_outputs(exported(**inputs), expected)
    return model, exported


def test_torch_export_of_the_forward_pass_matches_eager_on_other_shapes(one_thread):
    """Dynamic shapes: one program for every batch size, source and target length, with the cache it returns."""
    check_forward("dynamo", dynamic=True)


@pytest.mark.slow
@pytest.mark.parametrize(
    "backend, dynamic",
    [("dynamo", False), ("onnx", False)],
    ids=["dynamo-static", "onnx-static"],
)
def test_export_of_the_forward_pass_matches_eager(one_thread, backend, dynamic):
    """Static shapes (dynamic ones: the test above, and the ONNX test below, which saves its export too)."""
    check_forward(backend, dynamic)


@pytest.mark.slow
def test_onnx_export_saves_and_loads_back(one_thread, tmp_path):
    """A dynamic ONNX export matches eager on the traced and other shapes; `ExportedModel.save_pretrained` writes
    model.onnx with the model's config; `from_pretrained` reads both back (the config as this package's class, without
    trust_remote_code: ONNX programs run no code) and runs the same."""
    model, exported = check_forward("onnx", dynamic=True)
    exported.save_pretrained(tmp_path)
    assert {"model.onnx", "model.onnx.data", "config.json", "export.json"} <= {p.name for p in tmp_path.iterdir()}
    loaded = ExportedModel.from_pretrained(tmp_path)
    assert (
        isinstance(loaded.config, VanillaTransformerConfig)
        and loaded.config.to_diff_dict() == model.config.to_diff_dict()
    )
    inputs = forward_inputs(*OTHER_SHAPES[0])
    with torch.no_grad():
        expected = model(**inputs)
    assert_same_outputs(loaded(**inputs), expected)


@pytest.mark.slow
@pytest.mark.parametrize(
    "backend, dynamic, cache",
    [
        ("dynamo", False, "dynamic"),
        ("dynamo", True, "dynamic"),
        ("dynamo", False, "static"),
        ("onnx", True, "dynamic"),
    ],
)
def test_export_for_generation_prefill_and_decode_match_eager(one_thread, backend, dynamic, cache):
    """`export_for_generation` captures generate()'s first decoder call (prefill: the encoder's output, an empty cache)
    and the next one (decode: one token on the filled cache), with the dynamic cache or a StaticCache; each exported
    step returns eager's logits and cache. (The encoder is not among the components: generate() runs it before the
    first decoder call; the forward exports above cover it.) A dynamic export also serves another batch: the exported
    prefill and decode step, the decode fed the cache the exported prefill returned, give the logits of the eager model
    decoding one token at a time. Only one decode step: its cache axis was traced at one token, which `torch.export`
    specialises (a size-1 axis is never dynamic), for Marian as for this model."""
    model = tiny_model()
    exporter, config = exporter_for(backend, dynamic)
    generation_config = copy.deepcopy(model.generation_config)
    if cache == "static":
        generation_config.cache_implementation, generation_config.max_cache_len = "static", 16
    ids, mask = source_batch(2, 7)
    components = decompose_for_generation(
        model, {"input_ids": ids, "attention_mask": mask}, generation_config=generation_config
    )
    assert list(components) == ["prefill", "decode"]
    exported = exporter.export_for_generation(
        model, {"input_ids": ids, "attention_mask": mask}, config, generation_config=generation_config
    )
    for name, (submodel, inputs) in components.items():
        with torch.no_grad():
            expected = submodel(**copy.deepcopy(inputs))
        assert_same_outputs(run_component(exported, name, inputs), expected)
    if not dynamic:
        return

    ids, mask = source_batch(3, 10)
    start = torch.full((3, 1), model.generation_config.decoder_start_token_id)
    decoder_input_ids = torch.cat([start, torch.randint(3, 64, (3, 1))], dim=1)
    with torch.no_grad():
        expected_logits, _ = decode_one_token_at_a_time(model, ids, mask, decoder_input_ids)
        encoder_outputs = model.get_encoder()(input_ids=ids, attention_mask=mask)
    empty = copy.deepcopy(components["prefill"][1]["cache"])
    steps, cache = [], empty
    for t, name in enumerate(["prefill", "decode"]):
        step = {"attention_mask": mask, "decoder_input_ids": decoder_input_ids[:, t : t + 1]}
        out = run_component(exported, name, {**step, "encoder_outputs": encoder_outputs, "cache": cache})
        cache = out.cache
        steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), expected_logits, atol=ATOL, rtol=RTOL)
