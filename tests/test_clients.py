"""Third-party clients on the plug-in, each beside a MarianMTModel of the same tiny size: peft (LoRA, PrefixTuning,
P-tuning, IA3), gradient checkpointing, flex attention, torchao and accelerate's disk offload. Each test runs on both
models, so that a change in a client shows up as a difference between the two, not as a skip. docs/clients.md has the
table of what works."""

import pytest
import torch
from conftest import tiny_config, tiny_marian
from peft import (
    IA3Config,
    LoraConfig,
    PeftModel,
    PrefixTuningConfig,
    PromptEncoderConfig,
    TaskType,
    get_peft_model,
)
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel

from vanilla_transformer import VanillaTransformerForConditionalGeneration

MODELS = ["vanilla", "marian"]
# peft's IA3 has no defaults for our model type; the same places in both: keys and values, and the second FFN layer
IA3_MODULES = {"vanilla": ["qkv_proj", "kv_proj", "fc2"], "marian": ["k_proj", "v_proj", "fc2"]}


def make(which: str, **overrides) -> PreTrainedModel:
    """A fresh tiny model in eval mode, without dropout: ours of conftest's tiny_config, or its Marian twin."""
    torch.manual_seed(0)
    overrides = {"dropout": 0.0, **overrides}
    if which == "vanilla":
        return VanillaTransformerForConditionalGeneration(tiny_config(**overrides)).eval()
    return tiny_marian(**overrides)


def batch(rows: int = 3, length: int = 9, pad: bool = True) -> dict[str, torch.Tensor]:
    """Source ids ending in eos (2), the later rows right-padded with 0, and labels of another length."""
    input_ids = torch.randint(3, 64, (rows, length))
    input_ids[:, -1] = 2
    attention_mask = torch.ones_like(input_ids)
    labels = torch.randint(3, 64, (rows, length - 2))
    if pad:
        for row in range(1, rows):
            input_ids[row, length - 2 * row :] = 0
            attention_mask[row, length - 2 * row :] = 0
            labels[row, length - 2 - row :] = -100
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def train_steps(model: torch.nn.Module, inputs: dict, steps: int = 3) -> list[float]:
    """A few optimizer steps on one batch: the losses, which fall when the trainable parameters learn (the models of
    these tests have no dropout, so that they fall every time)."""
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(steps):
        loss = model(**inputs).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


# ---------------------------------------------------------------- peft


@pytest.mark.parametrize("which", MODELS)
def test_peft_lora_trains_saves_loads_and_merges(which, tmp_path):
    model = get_peft_model(make(which), LoraConfig(task_type=TaskType.SEQ_2_SEQ_LM, target_modules="all-linear"))
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)
    inputs = batch()
    losses = train_steps(model, inputs)
    assert losses[-1] < losses[0]
    model.eval()
    expected = model(**inputs).logits
    model.save_pretrained(tmp_path)
    reloaded = PeftModel.from_pretrained(make(which), tmp_path).eval()
    torch.testing.assert_close(reloaded(**inputs).logits, expected)
    merged = reloaded.merge_and_unload()
    assert type(merged) is type(make(which)) and not any("lora_" in name for name, _ in merged.named_parameters())
    torch.testing.assert_close(merged(**inputs).logits, expected, atol=1e-5, rtol=1e-5)
    assert merged.generate(input_ids=inputs["input_ids"], max_new_tokens=4, num_beams=2).shape[0] == 3


@pytest.mark.parametrize("which", MODELS)
@pytest.mark.parametrize(
    "prompt_config",
    [
        PrefixTuningConfig(task_type=TaskType.SEQ_2_SEQ_LM, num_virtual_tokens=4),
        PromptEncoderConfig(task_type=TaskType.SEQ_2_SEQ_LM, num_virtual_tokens=4, encoder_hidden_size=16),
    ],
    ids=["prefix-tuning", "p-tuning"],
)
def test_peft_prompt_learning_trains_and_generates(which, prompt_config):
    """PrefixTuning hands the model a cache of virtual keys and values with labels (so use_cache=False): the model
    must read it all the same. P-tuning prepends virtual token embeddings to the source."""
    model = get_peft_model(make(which), prompt_config)
    inputs = batch()
    losses = train_steps(model, inputs)
    assert losses[-1] < losses[0]  # only the prompt's parameters train, and they learn
    model.eval()
    for beams in (1, 2):
        out = model.generate(
            input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], max_new_tokens=4, num_beams=beams
        )
        assert out.shape[0] == 3


@pytest.mark.parametrize("which", MODELS)
def test_peft_ia3_trains_and_merges(which):
    modules = IA3_MODULES[which]
    config = IA3Config(task_type=TaskType.SEQ_2_SEQ_LM, target_modules=modules, feedforward_modules=["fc2"])
    model = get_peft_model(make(which), config)
    scaled = [name for name, module in model.named_modules() if hasattr(module, "ia3_l")]
    per_layer = len(modules)  # the decoder layers also have cross-attention keys and values (kv_proj / k,v_proj)
    assert len(scaled) >= 2 * per_layer
    inputs = batch()
    losses = train_steps(model, inputs)
    assert losses[-1] < losses[0]
    model.eval()
    expected = model(**inputs).logits
    merged = model.merge_and_unload()
    torch.testing.assert_close(merged(**inputs).logits, expected, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- gradient checkpointing


@pytest.mark.parametrize("which", MODELS)
def test_gradient_checkpointing_recomputes_and_gives_the_same_gradients(which):
    inputs = batch()
    reference = make(which).train()
    reference(**inputs).loss.backward()
    model = make(which).train()
    model.gradient_checkpointing_enable()
    calls = []
    # a module inside the layer (the layer's own hooks stay outside the checkpoint, by design)
    fc2 = next(module for name, module in model.get_decoder().named_modules() if name.endswith("fc2"))
    fc2.register_forward_hook(lambda *args: calls.append(1))
    model(**inputs).loss.backward()
    assert len(calls) == 2  # it ran again in the backward pass: checkpointing is on
    expected = dict(reference.named_parameters())
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(parameter.grad, expected[name].grad, atol=1e-6, rtol=1e-5, msg=name)


# ---------------------------------------------------------------- flex attention


@pytest.fixture
def fresh_compile():
    """transformers runs flex attention through one torch.compile'd function per process: each test starts with no
    compiled code, as a user's process does, so that what it sees does not depend on the tests before it."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def padded_decoder_inputs(inputs: dict) -> dict:
    """The source batch with decoder ids and a decoder mask padded like the labels."""
    labels = inputs["labels"]
    return {
        "input_ids": inputs["input_ids"],
        "attention_mask": inputs["attention_mask"],
        "decoder_input_ids": labels.clamp(min=3),
        "decoder_attention_mask": (labels != -100).long(),
    }


@pytest.mark.parametrize("which", MODELS)
def test_flex_attention_can_be_chosen(which):
    model = make(which)
    model.set_attn_implementation("flex_attention")
    assert model.config._attn_implementation == "flex_attention"


@pytest.mark.slow
def test_flex_attention_matches_sdpa(fresh_compile):
    """Encoder self-, causal decoder self- and cross-attention with padding on both sides give sdpa's logits; greedy
    decoding of a padded batch and beam search of an unpadded one give its tokens, the cache included. Forward and
    generation only: torch 2.13 runs flex attention's backward only on GPUs.

    Both models in one test, one after the other: torch compiles the flex kernels and block masks on the first calls
    (about two minutes on 2 CPU cores with an empty inductor cache, as on a fresh CI machine), and Marian's calls, of
    the same sizes and through the same transformers masks, reuse what the plug-in's compiled."""
    inputs, unpadded = batch(), batch(pad=False)
    forward = padded_decoder_inputs(inputs)
    greedy = dict(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], max_new_tokens=5)
    beams = dict(input_ids=unpadded["input_ids"], max_new_tokens=5, num_beams=3, min_new_tokens=5)
    for which in MODELS:
        model = make(which, encoder_layers=1, decoder_layers=1)
        with torch.no_grad():
            expected = [model(**forward).logits, model.generate(**greedy), model.generate(**beams)]
            model.set_attn_implementation("flex_attention")
            torch.testing.assert_close(model(**forward).logits, expected[0], atol=1e-4, rtol=0, msg=which)
            assert torch.equal(model.generate(**greedy), expected[1]), which
            assert torch.equal(model.generate(**beams), expected[2]), which


# ---------------------------------------------------------------- torchao


@pytest.mark.parametrize("which", MODELS)
def test_torchao_int8_weight_only_loads_and_generates(which, tmp_path):
    torchao = pytest.importorskip("torchao.quantization", reason="torchao does not import here")
    from transformers import TorchAoConfig

    model = make(which)
    inputs = batch()
    expected = model(**inputs).logits
    model.save_pretrained(tmp_path)
    quantized = (
        type(model).from_pretrained(tmp_path, quantization_config=TorchAoConfig(torchao.Int8WeightOnlyConfig())).eval()
    )
    linear = (
        quantized.get_decoder().layers[0].fc1
        if which == "marian"
        else quantized.get_decoder().layers[0].feed_forward.fc1
    )
    assert "Int8" in type(linear.weight).__name__  # torchao's int8 tensor subclass
    torch.testing.assert_close(quantized(**inputs).logits, expected, atol=2e-3, rtol=0)
    assert quantized.generate(input_ids=inputs["input_ids"], max_new_tokens=4).shape[0] == 3


# ---------------------------------------------------------------- accelerate's disk offload


@pytest.mark.parametrize("which", MODELS)
def test_disk_offload_reports_only_the_truly_missing_weights(which, tmp_path):
    """Every weight offloaded to disk: the load report names the one weight the checkpoint lacks, and nothing that is
    there (the shared embedding's names under the stacks were reported missing). Running the offloaded model fails
    for both models in accelerate 1.16 (docs/clients.md)."""
    model = make(which)
    model.save_pretrained(tmp_path / "model")
    weights_file = tmp_path / "model" / "model.safetensors"
    weights = load_file(weights_file)
    absent = next(name for name in weights if name.endswith("layers.0.fc1.bias") or "feed_forward.fc1.bias" in name)
    save_file({k: v for k, v in weights.items() if k != absent}, weights_file, metadata={"format": "pt"})
    _, info = type(model).from_pretrained(
        tmp_path / "model", device_map={"": "disk"}, offload_folder=str(tmp_path / "offload"), output_loading_info=True
    )
    assert set(info["missing_keys"]) == {absent}
