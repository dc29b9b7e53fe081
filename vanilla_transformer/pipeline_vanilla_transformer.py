"""The translation pipeline of a vanilla-transformer checkpoint (transformers 5 has no built-in one any more).

Declared in every saved config (``custom_pipelines``) and copied into every checkpoint beside the model code, so that
``pipeline("translation", model=repo_id, trust_remote_code=True)`` works where this package is not installed. It
imports only torch and transformers.
"""

import torch
from transformers.pipelines import Pipeline


class VanillaTransformerTranslationPipeline(Pipeline):
    """Translates text with a sequence-to-sequence model, like the ``"translation"`` pipeline of transformers 4.

    Example:
        >>> translator = pipeline("translation", model="user/vanilla-transformer-en-de", trust_remote_code=True)
        >>> translator("A small test.")
        [{'translation_text': '...'}]
        >>> translator(["One.", "Two."], batch_size=2, num_beams=4)  # one dict per sentence
        [{'translation_text': '...'}, {'translation_text': '...'}]

    Generation parameters (``num_beams``, ``max_new_tokens``, ...) given at construction or call go to ``generate()``,
    on top of the checkpoint's ``generation_config.json``. ``return_tensors=True`` adds the generated ids as
    ``"translation_token_ids"``; ``truncation=True`` cuts inputs longer than the tokenizer's ``model_max_length``.
    """

    _pipeline_calls_generate = True
    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True

    def _sanitize_parameters(
        self,
        truncation: bool | None = None,
        return_tensors: bool | None = None,
        return_text: bool | None = None,
        clean_up_tokenization_spaces: bool | None = None,
        **generate_kwargs,
    ):
        preprocess_params = {} if truncation is None else {"truncation": truncation}
        postprocess_params = {}
        if return_tensors is not None:
            postprocess_params["return_tensors"] = return_tensors
        if return_text is not None:
            postprocess_params["return_text"] = return_text
        if clean_up_tokenization_spaces is not None:
            postprocess_params["clean_up_tokenization_spaces"] = clean_up_tokenization_spaces
        if getattr(self, "assistant_model", None) is not None:
            generate_kwargs["assistant_model"] = self.assistant_model
        return preprocess_params, generate_kwargs, postprocess_params

    def __call__(self, inputs, **kwargs):
        """Translate a string (returns a list of dicts, one per returned sequence) or a list of strings (returns one
        dict per string, or one list per string when ``num_return_sequences`` > 1)."""
        result = super().__call__(inputs, **kwargs)
        if isinstance(inputs, list) and all(isinstance(records, list) and len(records) == 1 for records in result):
            return [records[0] for records in result]
        return result

    def preprocess(self, text: str, truncation: bool = False) -> dict[str, torch.Tensor]:
        if not isinstance(text, str):
            raise TypeError(
                f"The translation pipeline translates str or list[str] inputs; got {type(text).__name__}: {text!r}."
            )
        encoding = self.tokenizer(text, truncation=truncation, return_tensors="pt", return_token_type_ids=False)
        return {"input_ids": encoding["input_ids"], "attention_mask": encoding["attention_mask"]}

    def _forward(self, model_inputs: dict[str, torch.Tensor], **generate_kwargs) -> dict[str, torch.Tensor]:
        batch_size = model_inputs["input_ids"].shape[0]
        generate_kwargs = self._prepare_generate_kwargs(generate_kwargs, return_dict_in_generate=False)
        output_ids = self.model.generate(**model_inputs, **generate_kwargs)
        # (batch * num_return_sequences, len) -> (batch, num_return_sequences, len): the pipeline unbatches dim 0
        return {"output_ids": output_ids.reshape(batch_size, -1, output_ids.shape[-1])}

    def postprocess(
        self,
        model_outputs: dict[str, torch.Tensor],
        return_tensors: bool = False,
        return_text: bool = True,
        clean_up_tokenization_spaces: bool = False,
    ) -> list[dict]:
        records = []
        for output_ids in model_outputs["output_ids"][0]:
            record = {}
            if return_tensors:
                record["translation_token_ids"] = output_ids
            if return_text:
                record["translation_text"] = self.tokenizer.decode(
                    output_ids, skip_special_tokens=True, clean_up_tokenization_spaces=clean_up_tokenization_spaces
                )
            records.append(record)
        return records


__all__ = ["VanillaTransformerTranslationPipeline"]
