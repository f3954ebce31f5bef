"""The benchmark scripts of bench/ on CPU at small sizes: what each times is what it claims."""
