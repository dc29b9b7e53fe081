"""The toolkit's Hub side: `model_card` writes a trained model's README.md (metadata, architecture, results, usage);
`upload` says what push_to_hub.py uploads."""
