"""Attack cases, one module per boundary (docs/security.md names each boundary)."""
