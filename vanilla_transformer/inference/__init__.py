"""The toolkit's inference side: `loading` (a trained model and its tokenizer, either engine), `translate` (beam search
in length-sorted batches), `score` (sacreBLEU, chrF, exact match) and `ctranslate2` (export to CTranslate2 and
translate with it). None imports datasets or the training stack."""
