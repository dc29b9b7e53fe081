"""transformers' own common model tests (``ModelTesterMixin`` of ``tests/test_modeling_common.py``) on the model, as
transformers runs them on BART and Marian: loading reports, tied weights, initialisation of missing weights, attention
backends, output capturing, save/load, training, and more than a hundred others.

transformers' tests are not part of its wheel. They run where ``TRANSFORMERS_TESTS_DIR`` names an unpacked source
distribution of the installed transformers version (CI's ``.ci/run`` fetches it from the package index):

    pip download --no-deps --no-binary :all: transformers==<installed version> && tar xzf transformers-*.tar.gz
    TRANSFORMERS_TESTS_DIR=$PWD/transformers-<version> python -m pytest -q tests/test_transformers_common.py

and are skipped otherwise. The source distribution lacks ``tests/generation`` and ``tests/exporters``: their mixins
are replaced by empty ones here (generation and export are tested in test_modeling.py), and the generation mixin is
inherited as transformers requires of a model that generates.
"""

import os
import sys
import types
import unittest

import pytest
import torch
import transformers
from transformers.models.auto import modeling_auto

from vanilla_transformer import (
    VanillaTransformerConfig,
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerForSequenceClassification,
    VanillaTransformerModel,
)

SOURCE = os.environ.get("TRANSFORMERS_TESTS_DIR", "")
if not os.path.isfile(os.path.join(SOURCE, "tests", "test_modeling_common.py")):
    pytest.skip(
        "transformers' common tests need TRANSFORMERS_TESTS_DIR: an unpacked transformers source distribution",
        allow_module_level=True,
    )
if f"transformers-{transformers.__version__}" not in os.path.basename(os.path.normpath(SOURCE)):
    pytest.fail(f"TRANSFORMERS_TESTS_DIR={SOURCE} is not transformers {transformers.__version__}, the installed one")

sys.path.insert(0, SOURCE)
MISSING_MIXINS = {
    "tests.generation.test_utils": "GenerationTesterMixin",
    "tests.exporters.test_export": "ExportTesterMixin",
}
for module, mixin in MISSING_MIXINS.items():
    try:
        __import__(module)
    except ImportError:  # not in the source distribution
        sys.modules[module] = types.ModuleType(module)
        setattr(sys.modules[module], mixin, type(mixin, (), {}))
from tests.generation.test_utils import GenerationTesterMixin  # noqa: E402
from tests.test_modeling_common import ModelTesterMixin, ids_tensor  # noqa: E402

# The common tests choose labels and skips by class name from transformers' own tables (e.g. labels only for the names
# in MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES), which AutoModel.register does not fill: a model of transformers'
# own would be listed there. The entries are added for the tests of this file only.
MAPPING_NAMES = [
    (modeling_auto.MODEL_MAPPING_NAMES, "VanillaTransformerModel"),
    (modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES, "VanillaTransformerForConditionalGeneration"),
    (modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES, "VanillaTransformerForSequenceClassification"),
]


class ModelTester:
    """Tiny configs and inputs in the shape ModelTesterMixin expects (as BART's tester: equal source and target
    lengths, an eos ending every source, which sequence classification reads)."""

    batch_size, seq_length, vocab_size, hidden_size, is_training = 13, 7, 99, 16, True
    num_hidden_layers, num_attention_heads = 2, 4
    encoder_seq_length = decoder_seq_length = key_length = seq_length

    def __init__(self, parent: unittest.TestCase, **overrides):
        self.parent, self.overrides = parent, overrides

    def get_config(self) -> VanillaTransformerConfig:
        return VanillaTransformerConfig(
            vocab_size=self.vocab_size,
            d_model=self.hidden_size,
            encoder_layers=self.num_hidden_layers,
            decoder_layers=self.num_hidden_layers,
            encoder_attention_heads=self.num_attention_heads,
            decoder_attention_heads=self.num_attention_heads,
            encoder_ffn_dim=4,
            decoder_ffn_dim=4,
            max_position_embeddings=20,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            decoder_start_token_id=1,
            **self.overrides,
        )

    def prepare_config_and_inputs_for_common(self) -> tuple[VanillaTransformerConfig, dict]:
        config = self.get_config()
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size).clamp(3)
        input_ids[:, -1] = config.eos_token_id
        decoder_input_ids = ids_tensor([self.batch_size, self.seq_length], config.decoder_vocab_size).clamp(3)
        inputs = {
            "input_ids": input_ids,
            "decoder_input_ids": decoder_input_ids,
            "attention_mask": input_ids.ne(config.pad_token_id),
            "decoder_attention_mask": decoder_input_ids.ne(config.pad_token_id),
        }
        return config, inputs


class VanillaTransformerCommonTest(ModelTesterMixin, GenerationTesterMixin, unittest.TestCase):
    """The defaults: one vocabulary, its embedding shared by both stacks and tied to lm_head."""

    all_model_classes = (
        VanillaTransformerModel,
        VanillaTransformerForConditionalGeneration,
        VanillaTransformerForSequenceClassification,
    )
    is_encoder_decoder = True
    # it runs only for models whose configuration file starts with a copyright line of 2023 or later
    test_can_init_all_missing_weights_before_2023 = True
    overrides: dict = {}

    @classmethod
    def setUpClass(cls):
        for names, class_name in MAPPING_NAMES:
            names["vanilla_transformer"] = class_name

    @classmethod
    def tearDownClass(cls):
        for names, _ in MAPPING_NAMES:
            names.pop("vanilla_transformer", None)

    def setUp(self):
        self.model_tester = ModelTester(self, **self.overrides)


class VanillaTransformerUntiedCommonTest(VanillaTransformerCommonTest):
    """Separate source and target vocabularies, and an lm_head of its own: nothing tied."""

    overrides = {"share_encoder_decoder_embeddings": False, "decoder_vocab_size": 87, "tie_word_embeddings": False}

    def test_inputs_embeds_matches_input_ids(self):
        # the common test embeds decoder ids with get_input_embeddings(), the source matrix: one vocabulary assumed
        config, inputs = self.model_tester.prepare_config_and_inputs_for_common()
        model = VanillaTransformerModel(config).eval()
        source, target = model.get_input_embeddings(), model.decoder.embeddings.embed_tokens
        self.assertIsNot(source, target)
        input_ids, decoder_input_ids = inputs.pop("input_ids"), inputs.pop("decoder_input_ids")
        with torch.no_grad():
            from_ids = model(input_ids=input_ids, decoder_input_ids=decoder_input_ids, **inputs)[0]
            embedded = {"inputs_embeds": source(input_ids), "decoder_inputs_embeds": target(decoder_input_ids)}
            from_embeds = model(**embedded, **inputs)[0]
        torch.testing.assert_close(from_embeds, from_ids)
