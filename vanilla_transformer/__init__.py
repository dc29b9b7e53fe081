"""vanilla-transformer: the "Attention Is All You Need" encoder-decoder as a native transformers model.

Importing the package registers the model with transformers' Auto classes.
"""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
)

from .configuration_vanilla_transformer import VanillaTransformerConfig
from .modeling_vanilla_transformer import (
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerForSequenceClassification,
    VanillaTransformerModel,
    VanillaTransformerPreTrainedModel,
)
from .pipeline_vanilla_transformer import VanillaTransformerTranslationPipeline

__version__ = "0.1.0"

AutoConfig.register(VanillaTransformerConfig.model_type, VanillaTransformerConfig, exist_ok=True)
AutoModel.register(VanillaTransformerConfig, VanillaTransformerModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(VanillaTransformerConfig, VanillaTransformerForConditionalGeneration, exist_ok=True)
AutoModelForSequenceClassification.register(
    VanillaTransformerConfig, VanillaTransformerForSequenceClassification, exist_ok=True
)

# save_pretrained then writes `auto_map` and copies the source files, so that a checkpoint loads with
# trust_remote_code=True where this package is not installed.
VanillaTransformerConfig.register_for_auto_class()
VanillaTransformerModel.register_for_auto_class("AutoModel")
VanillaTransformerForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")
VanillaTransformerForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")

__all__ = [
    "VanillaTransformerConfig",
    "VanillaTransformerPreTrainedModel",
    "VanillaTransformerModel",
    "VanillaTransformerForConditionalGeneration",
    "VanillaTransformerForSequenceClassification",
    "VanillaTransformerTranslationPipeline",
]
