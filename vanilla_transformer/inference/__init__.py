"""The toolkit's inference side: `translate` (a trained model, beam search in length-sorted batches) and `ctranslate2`
(export to CTranslate2 and translate with it). Neither imports datasets or the training stack."""
