"""groklens.probes: everything that touches a model through hooks (never file paths)."""
