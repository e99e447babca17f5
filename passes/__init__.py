"""The passes, one module each; the registry in rewriter/registry.py lists them."""
