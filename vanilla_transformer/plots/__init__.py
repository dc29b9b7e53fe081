"""The toolkit's pictures: `plotting` draws attention maps, the positional encoding and training curves (the `plot`
extra: matplotlib)."""
